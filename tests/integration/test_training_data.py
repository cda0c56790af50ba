"""Input data and checkpoints as the container sees them (training-contract.md §2, §4, §5.1, §6, §9):
Pipe-mode FIFOs per epoch (plain and Gzip), File-mode S3Prefix and ManifestFile layouts, the
checkpoint directory restored from and synced back to S3, the config files and environment of a
`local:` program, and boto3 inside the job reaching Kiln. Jobs run concurrently."""

import gzip
import os

import pytest

import training_helpers as th
from training_helpers import sm, s3  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = th.SHRINK_CONFIG

PIPE_OBJECTS = {  # key -> bytes (streamed in key order)
    "pipe/train/a.bin": b"A" * 1000,
    "pipe/train/b.bin": os.urandom(300 * 1024),  # larger than a pipe buffer
    "pipe/train/sub/": b"",  # folder marker
    "pipe/train/sub/c.bin": b"last object\n",
}
GZ_PLAIN = {"pipe/gz/x.gz": b"first member\n" * 100, "pipe/gz/y.gz": os.urandom(50_000)}
FILE_OBJECTS = {
    "files/a/1.csv": b"1,2,3\n",
    "files/b.txt": b"bee",
    "files/empty/": b"",
}
MANIFEST_OBJECTS = {
    "images/cats/1.jpg": os.urandom(2000),
    "images/dogs/2.jpg": os.urandom(3000),
    "images/x.bin": b"x",
    "images/ignored.bin": b"not listed in the manifest",
}
CKPT_SEED = {"ckpt-old.txt": b"step 100\n", "sub/state.bin": os.urandom(5000)}


@pytest.fixture(scope="module")
def bucket(s3):
    name = th.unique_name("data")
    s3.create_bucket(Bucket=name)
    for key, data in list(PIPE_OBJECTS.items()) + list(FILE_OBJECTS.items()) + list(MANIFEST_OBJECTS.items()):
        s3.put_object(Bucket=name, Key=key, Body=data)
    for key, data in GZ_PLAIN.items():
        s3.put_object(Bucket=name, Key=key, Body=gzip.compress(data))
    manifest = '[{"prefix": "s3://%s/images/"}, "cats/1.jpg", "dogs/2.jpg", "x.bin"]' % name
    s3.put_object(Bucket=name, Key="manifests/train.manifest", Body=manifest.encode())
    return name


@pytest.fixture(scope="module")
def jobs(sm, s3, bucket):
    names = {k: th.unique_name("d-" + k) for k in ("pipe", "file", "ckpt", "tensorboard", "shrunk")}

    pipe = th.training_request(
        names["pipe"], bucket, input_mode="Pipe", hyperparameters={"pipe_epochs": "2"},
        channels=[th.s3_channel("train", "s3://%s/pipe/train/" % bucket),
                  th.s3_channel("gz", "s3://%s/pipe/gz/" % bucket, CompressionType="Gzip")])
    sm.create_training_job(**pipe)

    file_job = th.training_request(
        names["file"], bucket,
        hyperparameters={"copy_channels": "1", "s3_put": "s3://%s/from-job/%s" % (bucket, names["file"])},
        channels=[th.s3_channel("files", "s3://%s/files/" % bucket, ContentType="text/csv"),
                  th.s3_channel("images", "s3://%s/manifests/train.manifest" % bucket, data_type="ManifestFile")],
        Environment={"MY_SETTING": "hello world", "AWS_REGION": "us-east-1"})
    sm.create_training_job(**file_job)

    for rel, data in CKPT_SEED.items():
        s3.put_object(Bucket=bucket, Key="ckpt/%s/%s" % (names["ckpt"], rel), Body=data)
    ckpt = th.training_request(
        names["ckpt"], bucket, hyperparameters={"checkpoint": "step 200"},
        CheckpointConfig={"S3Uri": "s3://%s/ckpt/%s/" % (bucket, names["ckpt"])})
    sm.create_training_job(**ckpt)

    # TensorBoard output (contract §4.4, §8): LocalPath synced to its S3OutputPath.
    tensorboard = th.training_request(
        names["tensorboard"], bucket,
        hyperparameters={"checkpoint": "tb events", "checkpoint_dir": "/opt/ml/output/tensorboard"},
        TensorBoardOutputConfig={"S3OutputPath": "s3://%s/tb/%s" % (bucket, names["tensorboard"])})
    sm.create_training_job(**tensorboard)

    # ml.m5.4xlarge (16 vCPUs, 64 GiB) is larger than this host: the shrink policy runs it on what
    # the host has and says so.
    sm.create_training_job(**th.training_request(names["shrunk"], bucket, instance_type="ml.m5.4xlarge"))
    return names


def _completed(module_kiln, sm, name):
    d = th.wait_for_status(sm, name, timeout=240, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", (name, d.get("FailureReason"))
    return d


def test_pipe_mode_two_epochs_and_gzip(module_kiln, sm, s3, jobs):
    d = _completed(module_kiln, sm, jobs["pipe"])
    report = th.model_report(s3, d)
    assert report["argv"][1:] == ["train"], report["argv"]
    idc = report["inputdataconfig"]
    assert idc["train"]["TrainingInputMode"] == "Pipe"
    assert idc["gz"]["TrainingInputMode"] == "Pipe" and idc["gz"]["CompressionType"] == "Gzip"
    assert "CompressionType" not in idc["train"]
    assert idc["train"]["S3DistributionType"] == "FullyReplicated"
    assert idc["train"]["RecordWrapperType"] == "None"

    train = b"".join(PIPE_OBJECTS[k] for k in sorted(PIPE_OBJECTS))
    gz = b"".join(GZ_PLAIN[k] for k in sorted(GZ_PLAIN))
    expected_train = {"sha256": th.sha256(train), "size": len(train)}
    expected_gz = {"sha256": th.sha256(gz), "size": len(gz)}
    assert report["pipes"]["train"] == [expected_train, expected_train]
    assert report["pipes"]["gz"] == [expected_gz, expected_gz]


def test_file_mode_prefix_and_manifest_layout(module_kiln, sm, s3, bucket, jobs):
    name = jobs["file"]
    d = _completed(module_kiln, sm, name)
    report = th.model_report(s3, d)
    chans = report["channels"]
    assert chans["files"] == {"a/1.csv": th.sha256(b"1,2,3\n"), "b.txt": th.sha256(b"bee")}
    assert chans["images"] == {
        "cats/1.jpg": th.sha256(MANIFEST_OBJECTS["images/cats/1.jpg"]),
        "dogs/2.jpg": th.sha256(MANIFEST_OBJECTS["images/dogs/2.jpg"]),
        "x.bin": th.sha256(b"x"),
    }
    idc = report["inputdataconfig"]
    assert idc["files"] == {"ContentType": "text/csv", "TrainingInputMode": "File",
                            "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
    assert idc["images"]["TrainingInputMode"] == "File"

    # Environment and config files (contract §4.3, §5.1).
    env = report["env"]
    assert env["TRAINING_JOB_NAME"] == name
    assert env["TRAINING_JOB_ARN"] == d["TrainingJobArn"]
    assert env["AWS_ENDPOINT_URL"].startswith("http")
    assert env["MY_SETTING"] == "hello world"
    assert env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"), "no credentials in the job"
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", env.get("NVIDIA_VISIBLE_DEVICES")
    assert not [k for k in env if k.startswith("SM_")], "Kiln must not set SM_* variables"
    rc = report["resourceconfig"]
    assert rc["current_host"] == "algo-1" and rc["hosts"] == ["algo-1"]
    assert rc["current_instance_type"] == "ml.m5.large"
    assert rc["current_group_name"] == "homogeneousCluster"
    assert report["hyperparameters"]["copy_channels"] == "1"
    # boto3 inside the job reached Kiln's S3 with the job's credentials.
    got = s3.get_object(Bucket=bucket, Key="from-job/" + name)["Body"].read()
    assert got == name.encode()


def test_checkpoints_restored_and_synced(module_kiln, sm, s3, bucket, jobs):
    name = jobs["ckpt"]
    d = _completed(module_kiln, sm, name)
    assert d["CheckpointConfig"]["S3Uri"] == "s3://%s/ckpt/%s/" % (bucket, name)
    report = th.model_report(s3, d)
    assert report["checkpoints_seen"] == {rel: th.sha256(data) for rel, data in CKPT_SEED.items()}
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/%s/" % name)
    keys = sorted(o["Key"][len("ckpt/%s/" % name):] for o in listed.get("Contents", []))
    assert keys == ["ckpt-new.txt", "ckpt-old.txt", "sub/state.bin"], keys
    assert s3.get_object(Bucket=bucket, Key="ckpt/%s/ckpt-new.txt" % name)["Body"].read() == b"step 200"
    assert s3.get_object(Bucket=bucket, Key="ckpt/%s/sub/state.bin" % name)["Body"].read() == CKPT_SEED["sub/state.bin"]


def test_tensorboard_output_synced(module_kiln, sm, s3, bucket, jobs):
    name = jobs["tensorboard"]
    d = _completed(module_kiln, sm, name)
    assert d["TensorBoardOutputConfig"]["S3OutputPath"] == "s3://%s/tb/%s" % (bucket, name)
    got = s3.get_object(Bucket=bucket, Key="tb/%s/ckpt-new.txt" % name)["Body"].read()
    assert got == b"tb events"


def test_shrink_policy_says_what_the_instance_got(module_kiln, sm, jobs):
    d = _completed(module_kiln, sm, jobs["shrunk"])
    training = [t for t in d["SecondaryStatusTransitions"] if t["Status"] == "Training"][0]
    assert "shrunk ml.m5.4xlarge" in training["StatusMessage"], training
    assert training["StatusMessage"].startswith("Training image download completed. Training in progress."), training
