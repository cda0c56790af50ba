"""The training-job API surface (control-plane-api.md §2.3, §4, §7, §8.1, §9.1): server-side
validation of CreateTrainingJob against the service model with AWS's messages (raw JSON for what
boto3 would refuse client-side, boto3 as well for what it lets through), the not-found / in-use /
illegal-stop errors, ListTrainingJobs filters, sorting and paging, tags, Delete and Update."""

import copy
import datetime
import json
import re

import botocore.session
import botocore.validate
import pytest
from botocore.exceptions import ClientError

import kiln_harness as kh
import training_helpers as th
from training_helpers import sm, s3  # noqa: F401 (module-scoped client fixtures)

KILN_CONFIG = th.SHRINK_CONFIG

NAME_PATTERN = "[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"
S3_PATTERN = "(https|s3)://([^/]+)/?(.*)"
MESSAGE_RE = re.compile(r"^(\d+) validation errors? detected: Value .+ at '[A-Za-z0-9.]+' failed to satisfy constraint: .+",
                        re.S)


@pytest.fixture(scope="module")
def bucket(s3):
    name = th.unique_name("api")
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key="data/x.csv", Body=b"1,2\n")
    return name


_debian_model = botocore.session.get_session().get_service_model("sagemaker")


def boto3_accepts(operation, params):
    """True when this boto3's client-side parameter validation lets `params` through."""
    shape = _debian_model.operation_model(operation).input_shape
    return not botocore.validate.ParamValidator().validate(params, shape).has_errors()


def raw_call(server, operation, payload):
    status, _, body = kh.json_request(server, "SageMaker." + operation, payload)
    return status, json.loads(body) if body else {}


def error_of(doc):
    msg = doc.get("message") or doc.get("Message")
    if doc.get("message") and doc.get("Message"):
        assert doc["message"] == doc["Message"], doc
    return doc.get("__type"), msg


def expect_validation(server, sm, req, fragments, operation="CreateTrainingJob", aws_format=True):
    """The request is rejected with ValidationException (raw JSON, and through boto3 when boto3
    lets it through); every fragment appears in the message; AWS's message shape when
    `aws_format`. Returns the message."""
    status, doc = raw_call(server, operation, req)
    code, msg = error_of(doc)
    assert (status, code) == (400, "ValidationException"), (status, doc)
    assert msg, doc
    if aws_format:
        m = MESSAGE_RE.match(msg)
        assert m, msg
        n = int(m.group(1))
        assert (n == 1) == msg.startswith("1 validation error detected: "), msg
        assert msg.count(" failed to satisfy constraint: ") == min(n, 10), msg
    for fragment in fragments:
        assert fragment in msg, "expected %r in %r" % (fragment, msg)
    if boto3_accepts(operation, req):
        method = getattr(sm, re.sub(r"(?<!^)([A-Z])", r"_\1", operation).lower())
        with pytest.raises(ClientError) as e:
            method(**req)
        assert e.value.response["Error"]["Code"] == "ValidationException"
        assert e.value.response["Error"]["Message"] == msg
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    if operation == "CreateTrainingJob" and re.fullmatch(NAME_PATTERN, str(req.get("TrainingJobName", ""))):
        assert th.describe_error(sm, req["TrainingJobName"]) == ("ValidationException", "Requested resource not found.")
    return msg


def _at(path, constraint):
    return "at '%s' failed to satisfy constraint: %s" % (path, constraint)


def _channels(bucket, n):
    return [th.s3_channel("ch%d" % i, "s3://%s/data/" % bucket) for i in range(n)]


def _set(path, value):
    def mutate(req):
        node = req
        for p in path[:-1]:
            node = node[p]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return mutate


_DELETE = object()
LONG_ROLE = "arn:aws:iam::000000000000:role/" + "r" * 2100

# (id, mutation(req, bucket), message fragments; None fragments = Kiln rule, code only)
CASES = [
    ("name-pattern", lambda r, b: r.update(TrainingJobName="bad_name"),
     [_at("trainingJobName", "Member must satisfy regular expression pattern: " + NAME_PATTERN)]),
    ("name-leading-hyphen", lambda r, b: r.update(TrainingJobName="-abc"),
     [_at("trainingJobName", "Member must satisfy regular expression pattern: " + NAME_PATTERN)]),
    ("name-too-long", lambda r, b: r.update(TrainingJobName="a" * 64),
     [_at("trainingJobName", "Member must have length less than or equal to 63")]),
    ("name-empty", lambda r, b: r.update(TrainingJobName=""),
     [_at("trainingJobName", "Member must have length greater than or equal to 1")]),
    ("name-missing", lambda r, b: r.pop("TrainingJobName"),
     ["Value null " + _at("trainingJobName", "Member must not be null")]),
    ("role-missing", lambda r, b: r.pop("RoleArn"), ["Value null " + _at("roleArn", "Member must not be null")]),
    ("output-missing", lambda r, b: r.pop("OutputDataConfig"),
     ["Value null " + _at("outputDataConfig", "Member must not be null")]),
    ("output-path-missing", lambda r, b: r.update(OutputDataConfig={}),
     ["Value null " + _at("outputDataConfig.s3OutputPath", "Member must not be null")]),
    ("input-mode-missing", lambda r, b: r["AlgorithmSpecification"].pop("TrainingInputMode"),
     ["Value null " + _at("algorithmSpecification.trainingInputMode", "Member must not be null")]),
    ("input-mode-enum", lambda r, b: r["AlgorithmSpecification"].update(TrainingInputMode="Stream"),
     ["Value 'Stream' " + _at("algorithmSpecification.trainingInputMode",
                              "Member must satisfy enum value set: [Pipe, File, FastFile]")]),
    ("instance-type-enum", lambda r, b: r["ResourceConfig"].update(InstanceType="ml.bogus.xlarge"),
     ["Value 'ml.bogus.xlarge' " + _at("resourceConfig.instanceType", "Member must satisfy enum value set: [")]),
    ("channel-input-mode-enum", lambda r, b: r.update(InputDataConfig=[dict(_channels(b, 1)[0], InputMode="Streaming")]),
     [_at("inputDataConfig.1.member.inputMode", "Member must satisfy enum value set: [Pipe, File, FastFile]")]),
    ("s3-data-type-enum", lambda r, b: r.update(InputDataConfig=[th.s3_channel("train", "s3://%s/data/" % b, data_type="Folder")]),
     [_at("inputDataConfig.1.member.dataSource.s3DataSource.s3DataType", "Member must satisfy enum value set: [")]),
    ("max-runtime-zero", lambda r, b: r["StoppingCondition"].update(MaxRuntimeInSeconds=0),
     [_at("stoppingCondition.maxRuntimeInSeconds", "Member must have value greater than or equal to 1")]),
    ("keep-alive-too-long", lambda r, b: r["ResourceConfig"].update(KeepAlivePeriodInSeconds=21601),
     [_at("resourceConfig.keepAlivePeriodInSeconds", "Member must have value less than or equal to 21600")]),
    ("no-channels", lambda r, b: r.update(InputDataConfig=[]),
     [_at("inputDataConfig", "Member must have length greater than or equal to 1")]),
    ("21-channels", lambda r, b: r.update(InputDataConfig=_channels(b, 21)),
     [_at("inputDataConfig", "Member must have length less than or equal to 20")]),
    ("channel-name-pattern", lambda r, b: r.update(InputDataConfig=[dict(_channels(b, 1)[0], ChannelName="bad name!")]),
     ["Value 'bad name!' " + _at("inputDataConfig.1.member.channelName",
                                 "Member must satisfy regular expression pattern: [A-Za-z0-9\\.\\-_]+")]),
    ("channel-s3-uri-pattern", lambda r, b: r.update(InputDataConfig=[th.s3_channel("train", "bucket/key")]),
     ["Value 'bucket/key' " + _at("inputDataConfig.1.member.dataSource.s3DataSource.s3Uri",
                                  "Member must satisfy regular expression pattern: " + S3_PATTERN)]),
    ("41-metric-definitions", lambda r, b: r["AlgorithmSpecification"].update(
        MetricDefinitions=[{"Name": "m%d" % i, "Regex": "m%d=([0-9.]+)" % i} for i in range(41)]),
     [_at("algorithmSpecification.metricDefinitions", "Member must have length less than or equal to 40")]),
    ("metric-regex-empty", lambda r, b: r["AlgorithmSpecification"].update(MetricDefinitions=[{"Name": "x", "Regex": ""}]),
     [_at("algorithmSpecification.metricDefinitions.1.member.regex", "Member must have length greater than or equal to 1")]),
    ("entrypoint-empty", lambda r, b: r["AlgorithmSpecification"].update(ContainerEntrypoint=[]),
     [_at("algorithmSpecification.containerEntrypoint", "Member must have length greater than or equal to 1")]),
    ("101-hyperparameters", lambda r, b: r.update(HyperParameters={"k%03d" % i: "v" for i in range(101)}),
     [_at("hyperParameters", "Member must have length less than or equal to 100")]),
    ("hyperparameter-value-2501", lambda r, b: r.update(HyperParameters={"big": "v" * 2501}),
     [_at("hyperParameters", "Map value must satisfy constraint: [Member must have length less than or equal to 2500")]),
    ("hyperparameter-key-257", lambda r, b: r.update(HyperParameters={"k" * 257: "v"}),
     [_at("hyperParameters", "Map keys must satisfy constraint: [Member must have length less than or equal to 256")]),
    ("environment-key-pattern", lambda r, b: r.update(Environment={"1BAD": "x"}),
     [_at("environment", "Map keys must satisfy constraint: ["),
      "Member must satisfy regular expression pattern: [a-zA-Z_][a-zA-Z0-9_]*"]),
    ("environment-101", lambda r, b: r.update(Environment={"K%03d" % i: "v" for i in range(101)}),
     [_at("environment", "Member must have length less than or equal to 100")]),
    ("environment-value-513", lambda r, b: r.update(Environment={"K": "v" * 513}),
     [_at("environment", "Map value must satisfy constraint: [Member must have length less than or equal to 512")]),
    ("role-pattern", lambda r, b: r.update(RoleArn="arn:aws:iam::12345:role/not-twelve-digits"),
     [_at("roleArn", "Member must satisfy regular expression pattern: ")]),
    ("role-too-short", lambda r, b: r.update(RoleArn="arn:aws:iam::1:r"),
     [_at("roleArn", "Member must have length greater than or equal to 20")]),
    ("role-too-long", lambda r, b: r.update(RoleArn=LONG_ROLE),
     [_at("roleArn", "Member must have length less than or equal to 2048")]),
    ("output-path-pattern", lambda r, b: r.update(OutputDataConfig={"S3OutputPath": "ftp://bucket/x"}),
     ["Value 'ftp://bucket/x' " + _at("outputDataConfig.s3OutputPath",
                                      "Member must satisfy regular expression pattern: " + S3_PATTERN)]),
    ("checkpoint-uri-pattern", lambda r, b: r.update(CheckpointConfig={"S3Uri": "/local/dir"}),
     [_at("checkpointConfig.s3Uri", "Member must satisfy regular expression pattern: " + S3_PATTERN)]),
    ("51-tags", lambda r, b: r.update(Tags=[{"Key": "k%d" % i, "Value": "v"} for i in range(51)]),
     [_at("tags", "Member must have length less than or equal to 50")]),
    ("tag-key-pattern", lambda r, b: r.update(Tags=[{"Key": "bad#key", "Value": "v"}]),
     ["Value 'bad#key' " + _at("tags.1.member.key", "Member must satisfy regular expression pattern: ")]),
    ("tag-key-empty", lambda r, b: r.update(Tags=[{"Key": "", "Value": "v"}]),
     [_at("tags.1.member.key", "Member must have length greater than or equal to 1")]),
    ("tag-value-257", lambda r, b: r.update(Tags=[{"Key": "k", "Value": "v" * 257}]),
     [_at("tags.1.member.value", "Member must have length less than or equal to 256")]),
    ("tag-value-missing", lambda r, b: r.update(Tags=[{"Key": "k"}]),
     ["Value null " + _at("tags.1.member.value", "Member must not be null")]),
    ("retry-31", lambda r, b: r.update(RetryStrategy={"MaximumRetryAttempts": 31}),
     [_at("retryStrategy.maximumRetryAttempts", "Member must have value less than or equal to 30")]),
    # Kiln rules beyond the model (control-plane-api.md §8.1): code only.
    ("kiln-requires-algorithm-spec", lambda r, b: r.pop("AlgorithmSpecification"), None),
    ("kiln-requires-resource-config", lambda r, b: r.pop("ResourceConfig"), None),
    ("kiln-instance-count-zero", lambda r, b: r["ResourceConfig"].update(InstanceCount=0), None),
    # The current model types ResourceConfig.VolumeSizeInGB as OptionalVolumeSizeInGB (min 0, for
    # serverless jobs); Kiln requires a volume, so 0 is a Kiln-rule rejection.
    ("kiln-volume-zero", lambda r, b: r["ResourceConfig"].update(VolumeSizeInGB=0), None),
    ("kiln-volume-missing", lambda r, b: r["ResourceConfig"].pop("VolumeSizeInGB"), None),
]


@pytest.mark.parametrize("case_id,mutate,fragments", CASES, ids=[c[0] for c in CASES])
def test_create_validation(module_kiln, sm, bucket, case_id, mutate, fragments):
    req = th.training_request(th.unique_name("v"), bucket)
    mutate(req, bucket)
    expect_validation(module_kiln, sm, req, fragments or [], aws_format=fragments is not None)


def test_validation_exact_message_and_error_count(module_kiln, sm, bucket):
    req = th.training_request("bad_name", bucket)
    msg = expect_validation(module_kiln, sm, req, [])
    assert msg == ("1 validation error detected: Value 'bad_name' at 'trainingJobName' failed to satisfy "
                   "constraint: Member must satisfy regular expression pattern: " + NAME_PATTERN)

    req = th.training_request("bad_name", bucket)
    req["RoleArn"] = "not-a-role-arn-at-all-x"
    msg = expect_validation(module_kiln, sm, req, [])
    assert msg.startswith("2 validation errors detected: Value 'bad_name' at 'trainingJobName' failed"), msg
    assert "; Value 'not-a-role-arn-at-all-x' at 'roleArn' failed to satisfy constraint: " in msg, msg


def test_type_errors_are_serialization_exceptions(module_kiln, bucket):
    req = th.training_request(th.unique_name("v"), bucket)
    req["ResourceConfig"]["InstanceCount"] = "two"
    status, doc = raw_call(module_kiln, "CreateTrainingJob", req)
    assert (status, error_of(doc)[0]) == (400, "SerializationException"), doc
    status, _, body = kh.json_request(module_kiln, "SageMaker.CreateTrainingJob", None, raw_body=b"{not json")
    assert (status, json.loads(body)["__type"]) == (400, "SerializationException"), body


def test_unsupported_member_rejected(module_kiln, sm, bucket):
    req = th.training_request(th.unique_name("v"), bucket)
    req["ServerlessJobConfig"] = {
        "BaseModelArn": "arn:aws:sagemaker:us-east-1:aws:hub-content/SageMakerPublicHub/Model/llama/1.0.0",
        "JobType": "FineTuning"}
    status, doc = raw_call(module_kiln, "CreateTrainingJob", req)
    code, msg = error_of(doc)
    assert (status, code) == (400, "ValidationException"), doc
    assert "ServerlessJobConfig is not supported by Kiln" in msg, msg


def test_limits_at_the_boundary_are_accepted(module_kiln, sm, bucket):
    name = "a" + "-b" * 31
    assert len(name) == 63
    req = th.training_request(name, bucket, channels=_channels(bucket, 20))
    req["HyperParameters"] = {"k%03d" % i: "v" for i in range(99)}
    req["HyperParameters"]["big"] = "x" * 2500
    req["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": "m%d" % i, "Regex": "m%d=([0-9.]+)" % i}
                                                          for i in range(40)]
    req["Environment"] = {"K%03d" % i: "v" * 512 for i in range(40)}
    req["Tags"] = [{"Key": "k%02d" % i, "Value": "v" * 256} for i in range(50)]
    r = sm.create_training_job(**req)
    assert r["TrainingJobArn"].endswith(":training-job/" + name)
    d = th.wait_for_status(sm, name, timeout=180, server=module_kiln)
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert d["HyperParameters"] == req["HyperParameters"]
    assert len(d["InputDataConfig"]) == 20
    assert d["Environment"] == req["Environment"]


# ---------------------------------------------------------------------------------------------
# Errors for existing / missing jobs


def test_describe_and_stop_unknown_job(sm):
    for call in (sm.describe_training_job, sm.stop_training_job):
        with pytest.raises(ClientError) as e:
            call(TrainingJobName="no-such-job-" + th.unique_name("x"))
        assert e.value.response["Error"]["Code"] == "ValidationException"
        assert e.value.response["Error"]["Message"] == "Requested resource not found."
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


@pytest.fixture(scope="module")
def listed_jobs(module_kiln, sm, bucket):
    """Three finished jobs created in the order c, a, b (b fails), tagged at creation."""
    prefix = th.unique_name("Lst")
    names = {}
    for suffix, exit_code in (("c", "0"), ("a", "0"), ("b", "1")):
        name = "%s-%s" % (prefix, suffix)
        sm.create_training_job(**th.training_request(
            name, bucket, hyperparameters={"exit_code": exit_code},
            Tags=[{"Key": "team", "Value": "ml"}, {"Key": "suffix", "Value": suffix}]))
        names[suffix] = name
    done = {k: th.wait_for_status(sm, n, timeout=180, server=module_kiln) for k, n in names.items()}
    assert done["a"]["TrainingJobStatus"] == "Completed" and done["c"]["TrainingJobStatus"] == "Completed"
    assert done["b"]["TrainingJobStatus"] == "Failed"
    return prefix, names, done


def test_duplicate_name_is_resource_in_use(sm, bucket, listed_jobs):
    _, names, done = listed_jobs
    with pytest.raises(ClientError) as e:
        sm.create_training_job(**th.training_request(names["a"], bucket))
    assert e.value.response["Error"]["Code"] == "ResourceInUse"
    assert "already exists" in e.value.response["Error"]["Message"]
    assert done["a"]["TrainingJobArn"] in e.value.response["Error"]["Message"]
    # The original is untouched.
    assert sm.describe_training_job(TrainingJobName=names["a"])["TrainingJobStatus"] == "Completed"


def test_stop_finished_job_is_validation_error(sm, listed_jobs):
    _, names, _ = listed_jobs
    for key, status in (("a", "Completed"), ("b", "Failed")):
        with pytest.raises(ClientError) as e:
            sm.stop_training_job(TrainingJobName=names[key])
        assert e.value.response["Error"]["Code"] == "ValidationException"
        assert status in e.value.response["Error"]["Message"]
        assert sm.describe_training_job(TrainingJobName=names[key])["TrainingJobStatus"] == status


def test_update_finished_job_is_validation_error(sm, listed_jobs):
    _, names, _ = listed_jobs
    with pytest.raises(ClientError) as e:
        sm.update_training_job(TrainingJobName=names["a"], ResourceConfig={"KeepAlivePeriodInSeconds": 60})
    assert e.value.response["Error"]["Code"] == "ValidationException"


def _names(summaries):
    return [s["TrainingJobName"] for s in summaries]


def test_list_training_jobs_filters_sorting_paging(module_kiln, sm, listed_jobs):
    prefix, names, done = listed_jobs
    c, a, b = names["c"], names["a"], names["b"]

    r = sm.list_training_jobs(NameContains=prefix)
    assert _names(r["TrainingJobSummaries"]) == [c, a, b]  # default: CreationTime ascending
    assert "NextToken" not in r
    s = {x["TrainingJobName"]: x for x in r["TrainingJobSummaries"]}
    assert s[a]["TrainingJobArn"] == done["a"]["TrainingJobArn"]
    assert s[a]["TrainingJobStatus"] == "Completed" and s[b]["TrainingJobStatus"] == "Failed"
    # SecondaryStatus is newer than Debian's boto3 model (which drops it): read the raw answer.
    status, doc = raw_call(module_kiln, "ListTrainingJobs", {"NameContains": prefix})
    assert status == 200, doc
    raw = {x["TrainingJobName"]: x for x in doc["TrainingJobSummaries"]}
    assert raw[a]["SecondaryStatus"] == "Completed" and raw[b]["SecondaryStatus"] == "Failed", raw
    assert isinstance(raw[a]["CreationTime"], (int, float)), raw[a]
    assert s[a]["CreationTime"] == done["a"]["CreationTime"]
    assert s[a]["TrainingEndTime"] == done["a"]["TrainingEndTime"]
    assert s[a]["LastModifiedTime"] == done["a"]["LastModifiedTime"]

    assert _names(sm.list_training_jobs(NameContains=prefix.upper())["TrainingJobSummaries"]) == [c, a, b]
    assert _names(sm.list_training_jobs(NameContains=prefix, SortBy="Name", SortOrder="Ascending")
                  ["TrainingJobSummaries"]) == [a, b, c]
    assert _names(sm.list_training_jobs(NameContains=prefix, SortBy="Name", SortOrder="Descending")
                  ["TrainingJobSummaries"]) == [c, b, a]
    assert _names(sm.list_training_jobs(NameContains=prefix, SortBy="CreationTime", SortOrder="Descending")
                  ["TrainingJobSummaries"]) == [b, a, c]
    assert _names(sm.list_training_jobs(NameContains=prefix, StatusEquals="Failed")["TrainingJobSummaries"]) == [b]
    assert _names(sm.list_training_jobs(NameContains=prefix, StatusEquals="Completed")
                  ["TrainingJobSummaries"]) == [c, a]
    assert sm.list_training_jobs(NameContains=prefix, StatusEquals="InProgress")["TrainingJobSummaries"] == []
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    assert _names(sm.list_training_jobs(NameContains=prefix, CreationTimeAfter=past)["TrainingJobSummaries"]) == [c, a, b]
    assert sm.list_training_jobs(NameContains=prefix, CreationTimeBefore=past)["TrainingJobSummaries"] == []
    assert sm.list_training_jobs(NameContains=prefix, CreationTimeAfter=future)["TrainingJobSummaries"] == []
    assert _names(sm.list_training_jobs(NameContains=prefix, LastModifiedTimeBefore=future)
                  ["TrainingJobSummaries"]) == [c, a, b]

    # Paging one at a time.
    got, token, first_token = [], None, None
    for _ in range(5):
        kwargs = dict(NameContains=prefix, MaxResults=1)
        if token:
            kwargs["NextToken"] = token
        r = sm.list_training_jobs(**kwargs)
        got += _names(r["TrainingJobSummaries"])
        token = r.get("NextToken")
        first_token = first_token or token
        if not token:
            break
    assert got == [c, a, b]
    assert first_token

    # Bad tokens and ranges.
    with pytest.raises(ClientError) as e:
        sm.list_training_jobs(NextToken="definitely-not-a-token")
    assert e.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(ClientError) as e:
        sm.list_training_jobs(NameContains="something-else", MaxResults=1, NextToken=first_token)
    assert e.value.response["Error"]["Code"] == "ValidationException"
    assert e.value.response["Error"]["Message"] == "The provided NextToken is invalid."
    expect_validation(module_kiln, sm, {"MaxResults": 101},
                      [_at("maxResults", "Member must have value less than or equal to 100")],
                      operation="ListTrainingJobs")
    expect_validation(module_kiln, sm, {"MaxResults": 0},
                      [_at("maxResults", "Member must have value greater than or equal to 1")],
                      operation="ListTrainingJobs")
    expect_validation(module_kiln, sm, {"SortBy": "Size"},
                      [_at("sortBy", "Member must satisfy enum value set: [Name, CreationTime, Status]")],
                      operation="ListTrainingJobs")


def test_default_page_size_is_ten(module_kiln, sm, listed_jobs):
    r = sm.list_training_jobs()
    assert len(r["TrainingJobSummaries"]) <= 10
    if len(r["TrainingJobSummaries"]) == 10:
        assert r.get("NextToken")


def test_tags_round_trip(sm, listed_jobs):
    _, names, done = listed_jobs
    arn = done["a"]["TrainingJobArn"]

    def tags():
        return {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn)["Tags"]}

    assert tags() == {"team": "ml", "suffix": "a"}
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "extra", "Value": "1"}, {"Key": "team", "Value": "ml2"}])
    assert tags() == {"team": "ml2", "suffix": "a", "extra": "1"}
    sm.delete_tags(ResourceArn=arn, TagKeys=["suffix", "not-there"])
    assert tags() == {"team": "ml2", "extra": "1"}
    # Other jobs keep theirs.
    other = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=done["c"]["TrainingJobArn"])["Tags"]}
    assert other == {"team": "ml", "suffix": "c"}


def test_delete_training_job(module_kiln, sm, s3, listed_jobs):
    _, names, done = listed_jobs
    name = names["c"]
    status, doc = raw_call(module_kiln, "DeleteTrainingJob", {"TrainingJobName": name})
    assert status == 200, doc

    def gone():
        return th.describe_error(sm, name) == ("ValidationException", "Requested resource not found.")
    th.wait_until(gone, timeout=30, what="deleted job to disappear")
    assert name not in _names(sm.list_training_jobs(NameContains=name)["TrainingJobSummaries"])
    # S3 artifacts are kept.
    assert th.model_files(s3, done["c"]) is not None
    status, doc = raw_call(module_kiln, "DeleteTrainingJob", {"TrainingJobName": name})
    assert (status, error_of(doc)[0]) == (400, "ValidationException"), doc
