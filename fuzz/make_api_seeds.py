#!/usr/bin/env python3
"""Writes the seed corpora of the issue-9 targets (fuzz/corpus/<target>/):
json_protocol_fuzzer, service_model_fuzzer, query_form_fuzzer, tar_extract_fuzzer,
log_events_fuzzer and metrics_fuzzer. Layouts are described at the top of each <target>.cc.

    python3 fuzz/make_api_seeds.py

Seeds are small valid inputs (one per common operation) plus a few edge cases each target
should survive (deep nesting, unsafe archive members, damaged files). Existing seed files of these
targets are replaced; nothing else is touched.
"""
import gzip
import io
import json
import os
import shutil
import struct
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROLE = "arn:aws:iam::000000000000:role/r"
LOGS = "Logs_20140328"

TRAINING_JOB = {
    "TrainingJobName": "job-2", "RoleArn": ROLE,
    "AlgorithmSpecification": {"TrainingImage": "local:/bin/true", "TrainingInputMode": "File",
                               "MetricDefinitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}]},
    "HyperParameters": {"epochs": "2", "lr": "0.1"},
    "InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": "s3://b/train/", "S3DataDistributionType": "FullyReplicated"}}}],
    "OutputDataConfig": {"S3OutputPath": "s3://b/out/"},
    "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "Environment": {"A": "1"},
    "Tags": [{"Key": "team", "Value": "ml"}],
}

SAGEMAKER = {
    "CreateTrainingJob": TRAINING_JOB,
    "DescribeTrainingJob": {"TrainingJobName": "job-1"},
    "ListTrainingJobs": {"MaxResults": 10, "SortBy": "CreationTime", "SortOrder": "Descending",
                         "NameContains": "job", "StatusEquals": "InProgress", "CreationTimeAfter": 1714550000},
    "StopTrainingJob": {"TrainingJobName": "job-1"},
    "UpdateTrainingJob": {"TrainingJobName": "job-1", "ResourceConfig": {"KeepAlivePeriodInSeconds": 60}},
    "DeleteTrainingJob": {"TrainingJobName": "job-1"},
    "CreateModel": {"ModelName": "model-2", "ExecutionRoleArn": ROLE,
                    "PrimaryContainer": {"Image": "local:/bin/serve", "ModelDataUrl": "s3://b/model.tar.gz",
                                         "Environment": {"X": "1"}}},
    "DescribeModel": {"ModelName": "model-1"},
    "ListModels": {"MaxResults": 5, "NameContains": "model", "SortBy": "Name"},
    "DeleteModel": {"ModelName": "model-1"},
    "CreateEndpointConfig": {"EndpointConfigName": "config-2", "ProductionVariants": [
        {"VariantName": "a", "ModelName": "model-1", "InstanceType": "ml.m5.large", "InitialInstanceCount": 1,
         "InitialVariantWeight": 0.7},
        {"VariantName": "b", "ModelName": "model-1", "InstanceType": "ml.t2.medium", "InitialInstanceCount": 1,
         "InitialVariantWeight": 0.3}]},
    "DescribeEndpointConfig": {"EndpointConfigName": "config-1"},
    "ListEndpointConfigs": {"SortOrder": "Ascending"},
    "CreateEndpoint": {"EndpointName": "endpoint-2", "EndpointConfigName": "config-1",
                       "Tags": [{"Key": "k", "Value": "v"}]},
    "DescribeEndpoint": {"EndpointName": "endpoint-1"},
    "ListEndpoints": {"MaxResults": 10, "StatusEquals": "Creating", "SortBy": "Name"},
    "UpdateEndpoint": {"EndpointName": "endpoint-1", "EndpointConfigName": "config-1"},
    "UpdateEndpointWeightsAndCapacities": {"EndpointName": "endpoint-1", "DesiredWeightsAndCapacities": [
        {"VariantName": "v1", "DesiredWeight": 2, "DesiredInstanceCount": 1}]},
    "DeleteEndpoint": {"EndpointName": "endpoint-1"},
    "AddTags": {"ResourceArn": "arn:aws:sagemaker:us-east-1:000000000000:training-job/job-1",
                "Tags": [{"Key": "a", "Value": "b"}]},
    "ListTags": {"ResourceArn": "arn:aws:sagemaker:us-east-1:000000000000:endpoint/endpoint-1"},
    "DeleteTags": {"ResourceArn": "arn:aws:sagemaker:us-east-1:000000000000:model/model-1", "TagKeys": ["a"]},
}

STREAM = "job-1/algo-1-1714557600"
GROUP = "/aws/sagemaker/TrainingJobs"
LOGS_OPS = {
    "CreateLogGroup": {"logGroupName": "/g2"},
    "CreateLogStream": {"logGroupName": GROUP, "logStreamName": "s3"},
    "PutLogEvents": {"logGroupName": GROUP, "logStreamName": STREAM,
                     "logEvents": [{"timestamp": 1714557601000, "message": "epoch 2 loss=0.25"},
                                   {"timestamp": 1714557602000, "message": "done"}]},
    "GetLogEvents": {"logGroupName": GROUP, "logStreamName": STREAM, "startFromHead": True, "limit": 10},
    "FilterLogEvents": {"logGroupName": GROUP, "filterPattern": "loss", "logStreamNamePrefix": "job-1", "limit": 5},
    "DescribeLogStreams": {"logGroupName": GROUP, "orderBy": "LastEventTime", "descending": True, "limit": 5},
    "DescribeLogGroups": {"logGroupNamePrefix": "/aws", "limit": 5},
    "DeleteLogStream": {"logGroupName": GROUP, "logStreamName": STREAM},
}


def write(target, name, content):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode())


def reset(target):
    shutil.rmtree(os.path.join(HERE, "corpus", target), ignore_errors=True)


def deep(levels):
    return "[" * levels + "]" * levels


def json_protocol():
    t = "json_protocol_fuzzer"
    reset(t)
    for op, body in SAGEMAKER.items():
        write(t, op, f"SageMaker.{op}\n" + json.dumps(body))
    for op, body in LOGS_OPS.items():
        write(t, "Logs_" + op, f"{LOGS}.{op}\n" + json.dumps(body))
    # Edge cases: deep nesting (issue 9 finding 1 was 55,000 levels; ASan frames overflow sooner),
    # an unknown nested member, a body that is not an object, an unknown operation.
    write(t, "deep_list_training_jobs", "SageMaker.ListTrainingJobs\n{\"X\":" + deep(20000) + "}")
    write(t, "deep_create_model_member", "SageMaker.CreateModel\n" + json.dumps(
        {"ModelName": "m", "ExecutionRoleArn": ROLE, "PrimaryContainer": {"Image": "x"}})[:-1] +
        ",\"Unknown\":" + deep(2000) + "}")
    write(t, "not_object", "SageMaker.ListModels\n[1,2]")
    write(t, "unknown_op", "SageMaker.CreateHyperParameterTuningJob\n{}")


def service_model():
    t = "service_model_fuzzer"
    reset(t)
    for op, body in SAGEMAKER.items():
        write(t, op, f"{op}\n" + json.dumps(body))
    bad = dict(TRAINING_JOB, TrainingJobName="bad name!", ResourceConfig={"InstanceType": "ml.none",
                                                                           "InstanceCount": "one"})
    write(t, "CreateTrainingJob_invalid", "CreateTrainingJob\n" + json.dumps(bad))
    write(t, "CreateTrainingJob_range", "CreateTrainingJob\n" + json.dumps(
        dict(TRAINING_JOB, StoppingCondition={"MaxRuntimeInSeconds": 2 ** 62})))
    write(t, "ListTrainingJobs_types", "ListTrainingJobs\n" + json.dumps(
        {"MaxResults": 1.5, "CreationTimeAfter": "2024-05-01T10:00:00Z", "SortBy": None}))
    # A long multi-byte value: messages quote at most 1,024 bytes of it (3-byte characters).
    write(t, "CreateModel_long_utf8", "CreateModel\n" + json.dumps(
        {"ModelName": "\u20ac" * 400, "ExecutionRoleArn": "\u00e9" * 1001}, ensure_ascii=False))
    write(t, "by_number", "\x07\n{}")


def query_form():
    t = "query_form_fuzzer"
    reset(t)
    write(t, "post_form", b"\x00\nAction=GetCallerIdentity&Version=2011-06-15")
    write(t, "get_query", b"\x01Action=GetCallerIdentity&Version=2011-06-15\n")
    write(t, "post_form_charset", b"\x04\nAction=GetCallerIdentity&Version=2011-06-15&X=%41%2b+b")
    write(t, "unknown_action", b"\x00\nAction=AssumeRole&RoleArn=arn%3Aaws%3Aiam%3A%3A1%3Arole%2Fr&RoleSessionName=s")
    write(t, "missing_action", b"\x00\nVersion=2011-06-15&&=&a")
    write(t, "query_and_form", b"\x00Action=Nope\nAction=GetCallerIdentity")
    write(t, "signed_sts", b"\x08\nAction=GetCallerIdentity&Version=2011-06-15")
    write(t, "bad_percent", b"\x00\nAction=%zz&Version=%")


def tar_bytes(members, fmt=tarfile.PAX_FORMAT, compress=False):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for m in members:
            info = tarfile.TarInfo(m["name"])
            info.mtime = 1714557600
            kind = m.get("kind", "file")
            data = m.get("data", b"")
            if kind == "file":
                info.size = len(data)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}[kind]
            info.linkname = m.get("link", "")
            info.mode = 0o755
            tar.addfile(info)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if compress else raw


def tar_extract():
    t = "tar_extract_fuzzer"
    reset(t)
    model = [{"name": "model", "kind": "dir"}, {"name": "model/weights.bin", "data": b"\x00\x01" * 32},
             {"name": "code/inference.py", "data": b"print('hi')\n"},
             {"name": "latest", "kind": "sym", "link": "model/weights.bin"},
             {"name": "copy.bin", "kind": "hard", "link": "model/weights.bin"}]
    write(t, "model_gz", b"\x00" + tar_bytes(model, compress=True))
    write(t, "model_plain_gnu", b"\x00" + tar_bytes(model, fmt=tarfile.GNU_FORMAT))
    write(t, "model_ustar_strict", b"\x03" + tar_bytes(model, fmt=tarfile.USTAR_FORMAT))
    write(t, "long_names_pax", b"\x00" + tar_bytes([{"name": "d/" + "n" * 200, "data": b"x"},
                                                    {"name": "d/\u00e9t\u00e9.txt", "data": b"y"}]))
    write(t, "dotdot", b"\x00" + tar_bytes([{"name": "../escape", "data": b"x"}]))
    write(t, "absolute", b"\x00" + tar_bytes([{"name": "/tmp/escape", "data": b"x"}]))
    write(t, "symlink_out", b"\x00" + tar_bytes([{"name": "l", "kind": "sym", "link": "../outside"},
                                                 {"name": "l/canary", "data": b"x"}]))
    write(t, "symlink_loop", b"\x00" + tar_bytes([{"name": "a", "kind": "sym", "link": "."},
                                                  {"name": "b", "kind": "sym", "link": "a/.."}]))
    write(t, "hardlink_out", b"\x02" + tar_bytes([{"name": "h", "kind": "hard", "link": "/etc/passwd"}]))
    write(t, "special", b"\x01" + tar_bytes([{"name": "fifo", "kind": "fifo"}, {"name": "dev", "kind": "chr"}]))
    write(t, "through_existing_link", b"\x04" + tar_bytes([{"name": "up/canary", "data": b"overwritten"},
                                                           {"name": "d/x", "data": b"x"}]))
    write(t, "file_then_dir", b"\x00" + tar_bytes([{"name": "f", "data": b"x"}, {"name": "f/g", "data": b"y"}]))
    # With the unpack cap (bit 3: 64 KiB, 8 members): within it, and a small gzip bomb past it.
    write(t, "model_gz_capped", b"\x08" + tar_bytes(model, compress=True))
    write(t, "many_members_capped", b"\x08" + tar_bytes([{"name": f"f{i}", "data": b"x"} for i in range(12)],
                                                        compress=True))
    write(t, "bomb_capped", b"\x08" + tar_bytes([{"name": "zeros", "data": b"\x00" * (1 << 20)}], compress=True))


def log_events():
    t = "log_events_fuzzer"
    reset(t)
    ops = {
        "PutLogEvents": {"logGroupName": "/g", "logStreamName": "s2",
                         "logEvents": [{"timestamp": 1714557600000, "message": "a"},
                                       {"timestamp": 1714557600001, "message": "b"}]},
        "GetLogEvents": {"logGroupName": "/g", "logStreamName": "s1", "startFromHead": True, "limit": 2},
        "GetLogEvents_tail": {"logGroupName": "/g", "logStreamName": "s1", "startTime": 1001, "endTime": 1004},
        "GetLogEvents_token": {"logGroupName": "/g", "logStreamName": "s1", "nextToken": "f/00000000000000000003"},
        "FilterLogEvents": {"logGroupName": "/g", "filterPattern": "\"line\" ?0 ?5 -x", "limit": 2,
                            "logStreamNames": ["s1", "s2"]},
        "DescribeLogStreams": {"logGroupName": "/g", "logStreamNamePrefix": "s", "limit": 1},
        "DescribeLogStreams_arn": {"logGroupIdentifier": "arn:aws:logs:us-east-1:000000000000:log-group:/g",
                                   "orderBy": "LastEventTime", "descending": True},
        "DescribeLogGroups": {"logGroupNamePattern": "g", "limit": 1},
        "CreateLogStream": {"logGroupName": "/g", "logStreamName": "s3"},
        "DeleteLogGroup": {"logGroupName": "/g"},
    }
    for name, body in ops.items():
        write(t, name, b"\x00" + name.split("_")[0].encode() + b"\n" + json.dumps(body).encode())
    # Damaged files: the first record's length field made huge, a truncated record, garbage, and
    # an appended half record (file index 0: the only stream file with events).
    record = struct.pack("<Iqq", 6, 1000, 1714557600000) + b"line 0"
    write(t, "file_huge_length", b"\x01\x00\x01\x00" + struct.pack("<I", 0xFFFFFFF0))
    write(t, "file_truncated", b"\x01\x00\x02\x00" + record[:20])
    write(t, "file_replaced", b"\x01\x00\x00\x00" + record + b"\xff" * 7)
    write(t, "file_append_half", b"\x01\x00\x03\x00" + record[:9])
    write(t, "file_second", b"\x01\x01\x00\x00" + record * 2)


def metrics():
    t = "metrics_fuzzer"
    reset(t)
    write(t, "extract", b"\x00train:loss\tloss=([0-9.e+-]+)\nacc\tacc: (\\S+);\n\n"
          b"epoch 1 loss=0.5 acc: 0.9;\nloss=nan\nacc: 1e309;\n  loss=  7 \n")
    write(t, "extract_no_group", b"\x00m\tloss\nbad\t(unclosed\n\nloss=1\n")
    write(t, "extract_lazy", b"\x00Train Loss = (.*?);\n\nTrain Loss = 0.25;\n")
    write(t, "store", b"\x01/aws/sagemaker/TrainingJobs\x1ftrain:loss\x1fTrainingJobName=job-1\x1fHost=job-1/algo-1")
    write(t, "store_point", b"\x01ns\x1fname\x1fk=v\x1f#" + struct.pack("<qd", 1714557600000, 0.125))
    write(t, "store_nan", b"\x01ns\x1fname\x1f#" + struct.pack("<qd", -1, float("nan")))
    write(t, "store_bad_dims", b"\x01ns\x1fname\x1fa=b\x1f{\"a\":[1,{\"b\":null}]")


def dictionaries():
    """libFuzzer dictionaries (fuzz/<target>.dict): the operation names Kiln serves and the member
    names and enum values reachable from their input shapes, plus JSON tokens."""
    model = json.load(open(os.path.join(HERE, "..", "src", "api", "models", "sagemaker.json")))
    shapes = model["shapes"]
    tokens, seen = set(), set()

    def walk(name):
        if name in seen:
            return
        seen.add(name)
        shape = shapes[name]
        for member, ref in shape.get("members", {}).items():
            tokens.add(json.dumps(member))
            walk(ref["shape"])
        for key in ("member", "key", "value"):
            if key in shape:
                walk(shape[key]["shape"])
        for value in shape.get("enum", []):
            tokens.add(json.dumps(value))

    for op in SAGEMAKER:
        walk(model["operations"][op]["input"]["shape"])
    for body in LOGS_OPS.values():
        tokens.update(json.dumps(k) for k in body)
    common = ["{", "}", "[", "]", ":", ",", "null", "true", "false", "-1", "0.5", "1e999", "2147483648",
              "9223372036854775808", '"\\u0000"', '"\\ud800"', '"\\u00e9"']

    def escape(token):  # libFuzzer dictionary syntax: "..." with \\, \" and \xNN escapes
        out = ""
        for b in token.encode():
            c = chr(b)
            out += "\\" + c if c in '\\"' else c if 32 <= b < 127 else f"\\x{b:02x}"
        return '"' + out + '"'

    def dump(target, names):
        with open(os.path.join(HERE, target + ".dict"), "w") as f:
            f.write(f"# Generated by make_api_seeds.py: {target} dictionary.\n")
            for t in sorted(names) + common + sorted(tokens):
                f.write(escape(t) + "\n")

    dump("json_protocol_fuzzer", [f"SageMaker.{op}" for op in SAGEMAKER] + [f"{LOGS}.{op}" for op in LOGS_OPS])
    dump("service_model_fuzzer", list(SAGEMAKER))


def main():
    dictionaries()
    json_protocol()
    service_model()
    query_form()
    tar_extract()
    log_events()
    metrics()


if __name__ == "__main__":
    main()
