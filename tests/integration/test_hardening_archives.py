"""Issue 9 (hardening), archive part: a gzip bomb in model.tar.gz or sourcedir.tar.gz is stopped at
the cap derived from the instance's volume (or the operator's archives.max_unpacked_mib), fails the
endpoint / training job with the cap in FailureReason, and leaves nothing behind."""

import json
import os
import struct
import tarfile
import zlib

import pytest

import endpoint_helpers as eh
import training_helpers as th
from training_helpers import sm, s3  # noqa: F401 (module-scoped fixtures)

KILN_CONFIG = dict(eh.ENDPOINT_CONFIG, training={"stop_grace_seconds": 5})
MIB = 1 << 20
GIB = 1 << 30


def zero_tar_gz(files):
    """A gzip tar of zero-filled members [(name, size)], built in time proportional to its
    compressed size: a deflate block of 1 MiB of zeros that ends with a full flush does not depend
    on what came before, so it is compressed once and repeated (1 GiB -> about 1 MB)."""
    zeros = bytes(MIB)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"]
    state = {"crc": 0, "total": 0}
    zblock = []

    def feed(data):
        out.append(comp.compress(data) + comp.flush(zlib.Z_FULL_FLUSH))
        state["crc"] = zlib.crc32(data, state["crc"])
        state["total"] += len(data)

    for name, size in files:
        info = tarfile.TarInfo(name)
        info.size = size
        info.mode = 0o644
        feed(info.tobuf(format=tarfile.GNU_FORMAT))
        left = size
        while left >= MIB:
            if not zblock:
                zblock.append(comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH))
            out.append(zblock[0])
            state["crc"] = zlib.crc32(zeros, state["crc"])
            state["total"] += MIB
            left -= MIB
        if left or size % 512:
            feed(bytes(left + (-size) % 512))
    feed(bytes(1024))  # end-of-archive blocks
    out.append(comp.flush(zlib.Z_FINISH))
    out.append(struct.pack("<II", state["crc"] & 0xffffffff, state["total"] & 0xffffffff))
    return b"".join(out)


def test_zero_tar_gz_is_a_real_archive():
    import io
    data = zero_tar_gz([("a", 5), ("b", 2 * MIB + 3), ("c", 0)])
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        assert [(m.name, m.size, len(tf.extractfile(m).read())) for m in tf] == [
            ("a", 5, 5), ("b", 2 * MIB + 3, 2 * MIB + 3), ("c", 0, 0)]


def _leftovers(data_dir, min_size):
    """Files of at least min_size bytes outside the object store, and staging directories."""
    found = []
    for root, dirs, files in os.walk(data_dir):
        found += [os.path.join(root, d) for d in dirs if ".kiln-staging-" in d]
        if os.sep + "objects" in root or os.sep + "model-cache" in root:
            continue
        for f in files:
            path = os.path.join(root, f)
            if not os.path.islink(path) and os.path.getsize(path) >= min_size:
                found.append(path)
    return found


def _endpoint(sm, name, model_url, volume_gb=None):
    eh.create_model(sm, name + "-m", model_data_url=model_url)
    variant = {"VariantName": "AllTraffic", "ModelName": name + "-m", "InitialInstanceCount": 1,
               "InstanceType": "ml.m5.large", "InitialVariantWeight": 1.0}
    if volume_gb is not None:
        variant["VolumeSizeInGB"] = volume_gb
    sm.create_endpoint_config(EndpointConfigName=name + "-cfg", ProductionVariants=[variant])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name + "-cfg")


@pytest.fixture(scope="module")
def bucket(s3):
    s3.create_bucket(Bucket="archive-bombs")
    return "archive-bombs"


@pytest.fixture(scope="module")
def gib_bomb():
    """1 GiB + 1 byte of zeros in about 1 MB: past a 1 GiB volume."""
    return zero_tar_gz([("code/inference.py", 100), ("weights.bin", GIB + 1)])


def test_model_bomb_fails_the_endpoint_at_the_variant_volume(sm, s3, bucket, gib_bomb, module_kiln):
    s3.put_object(Bucket=bucket, Key="ep/model.tar.gz", Body=gib_bomb)
    url = "s3://%s/ep/model.tar.gz" % bucket
    name = eh.unique_name("ep-bomb")
    _endpoint(sm, name, url, volume_gb=1)
    d = eh.wait_endpoint(sm, name, statuses=("Failed",), server=module_kiln)
    reason = d["FailureReason"]
    assert reason.startswith("ClientError: ModelDataUrl %s unpacks to more than 1 GiB (the cap from the "
                             "variant's VolumeSizeInGB 1); please raise VolumeSizeInGB of production variant "
                             "AllTraffic" % url), reason
    assert _leftovers(module_kiln.data_dir, 1 * MIB) == []
    sm.delete_endpoint(EndpointName=name)


def test_sourcedir_bomb_fails_the_training_job_at_the_volume(sm, s3, bucket, gib_bomb, module_kiln):
    s3.put_object(Bucket=bucket, Key="job/sourcedir.tar.gz", Body=gib_bomb)
    url = "s3://%s/job/sourcedir.tar.gz" % bucket
    name = th.unique_name("tj-bomb")
    # VolumeSizeInGB 1 on ml.m5.large (no local NVMe).
    req = th.training_request(name, bucket, hyperparameters={"sagemaker_submit_directory": json.dumps(url),
                                                             "sagemaker_program": json.dumps("train.py")})
    assert req["ResourceConfig"]["VolumeSizeInGB"] == 1
    sm.create_training_job(**req)
    d = th.wait_for_status(sm, name, server=module_kiln)
    assert d["TrainingJobStatus"] == "Failed", d
    reason = d["FailureReason"]
    assert reason.startswith("ClientError: sagemaker_submit_directory %s unpacks to more than 1 GiB (the cap "
                             "from ResourceConfig.VolumeSizeInGB 1); please raise VolumeSizeInGB" % url), reason
    assert _leftovers(module_kiln.data_dir, 1 * MIB) == []


def test_operator_cap_stops_many_files_and_removes_what_was_written(kiln_factory):
    """archives.max_unpacked_mib = 8: an archive of 64 one-MiB files is cut after about 7 of them,
    whatever the variant's volume; what was written is removed; a model under the cap still
    deploys."""
    srv = kiln_factory("operator-cap", config=dict(KILN_CONFIG, archives={"max_unpacked_mib": 8}))
    sm_client = srv.client("sagemaker")
    s3_client = srv.client("s3")
    s3_client.create_bucket(Bucket="models")
    s3_client.put_object(Bucket="models", Key="many/model.tar.gz",
                         Body=zero_tar_gz([("part-%02d.bin" % i, MIB) for i in range(64)]))
    s3_client.put_object(Bucket="models", Key="small/model.tar.gz", Body=zero_tar_gz([("weights.bin", 6 * MIB)]))
    bomb = eh.unique_name("ep-many")
    _endpoint(sm_client, bomb, "s3://models/many/model.tar.gz", volume_gb=100)
    small = eh.unique_name("ep-small")
    _endpoint(sm_client, small, "s3://models/small/model.tar.gz")
    d = eh.wait_endpoint(sm_client, bomb, statuses=("Failed",), server=srv)
    assert d["FailureReason"].startswith(
        "ClientError: ModelDataUrl s3://models/many/model.tar.gz unpacks to more than 8 MiB (the cap set by the "
        "Kiln operator with archives.max_unpacked_mib in the server config)"), d["FailureReason"]
    assert "nothing was kept in /opt/ml/model" in d["FailureReason"]
    eh.wait_endpoint(sm_client, small, statuses=("InService",), server=srv)
    assert [p for p in _leftovers(srv.data_dir, MIB) if "part-" in p or ".kiln-staging-" in p] == []
    for name in (bomb, small):
        sm_client.delete_endpoint(EndpointName=name)
    eh.delete_all_endpoints(sm_client)

