"""CloudWatch Logs (spec/control-plane-api.md §11) through Debian's boto3: groups, streams,
PutLogEvents, GetLogEvents token paging, FilterLogEvents, DescribeLogStreams ordering, the error
cases, and events surviving a restart."""

import time
import uuid

import pytest
from botocore.exceptions import ClientError


def _name(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def _error(excinfo):
    return excinfo.value.response["Error"]["Code"], excinfo.value.response["Error"]["Message"]


@pytest.fixture(scope="module")
def logs(kiln):
    return kiln.client("logs")


def _put_all(logs, group, stream, messages, base, batch=1000):
    for i in range(0, len(messages), batch):
        events = [{"timestamp": base + k, "message": messages[k]} for k in range(i, min(len(messages), i + batch))]
        r = logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events)
        assert r["nextSequenceToken"]


@pytest.fixture(scope="module")
def filled(logs):
    """A group with stream 'main' holding 2,500 events (timestamps base..base+2499)."""
    group = "/kiln/test/" + _name("g")
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName="main")
    base = int(time.time() * 1000) - 60_000
    messages = ["event %04d %s" % (i, "ERROR" if i % 100 == 0 else "INFO") for i in range(2500)]
    _put_all(logs, group, "main", messages, base)
    return group, base, messages


def test_forward_paging_from_head_until_token_repeats(logs, filled):
    group, base, messages = filled
    got, token, pages = [], None, 0
    while True:
        kwargs = dict(logGroupName=group, logStreamName="main", limit=1000, startFromHead=True)
        if token:
            kwargs["nextToken"] = token
        r = logs.get_log_events(**kwargs)
        assert r["nextForwardToken"].startswith("f/") and r["nextBackwardToken"].startswith("b/")
        pages += 1
        if r["nextForwardToken"] == token:
            assert r["events"] == []
            break
        got.extend(r["events"])
        token = r["nextForwardToken"]
        assert pages < 10
    assert [e["message"] for e in got] == messages
    assert [e["timestamp"] for e in got] == [base + i for i in range(2500)]
    assert all(e["ingestionTime"] > 0 for e in got)
    assert pages == 4  # 1000 + 1000 + 500 + the empty end page

    # Appended later: visible to the old forward token, then the end repeats again.
    logs.put_log_events(logGroupName=group, logStreamName="main",
                        logEvents=[{"timestamp": base + 2500, "message": "late"}])
    r = logs.get_log_events(logGroupName=group, logStreamName="main", nextToken=token)
    assert [e["message"] for e in r["events"]] == ["late"]
    r2 = logs.get_log_events(logGroupName=group, logStreamName="main", nextToken=r["nextForwardToken"])
    assert r2["events"] == [] and r2["nextForwardToken"] == r["nextForwardToken"]
    messages.append("late")


def test_backward_paging_from_tail(logs, filled):
    group, _, messages = filled
    r = logs.get_log_events(logGroupName=group, logStreamName="main", limit=1000)
    got = r["events"]
    assert [e["message"] for e in got] == messages[-1000:]
    token = r["nextBackwardToken"]
    for _ in range(10):
        r = logs.get_log_events(logGroupName=group, logStreamName="main", limit=1000, nextToken=token)
        if not r["events"]:
            assert r["nextBackwardToken"] == token
            break
        got = r["events"] + got
        token = r["nextBackwardToken"]
    assert [e["message"] for e in got] == messages


def test_start_end_bounds_and_default_page(logs, filled):
    group, base, _ = filled
    r = logs.get_log_events(logGroupName=group, logStreamName="main", startTime=base + 100, endTime=base + 110,
                            startFromHead=True)
    assert [e["timestamp"] for e in r["events"]] == list(range(base + 100, base + 110))
    # The default page (no limit) holds everything that fits in 1 MB: all of these.
    r = logs.get_log_events(logGroupName=group, logStreamName="main", startFromHead=True)
    assert len(r["events"]) >= 2500


def test_filter_log_events(logs, filled):
    group, _, messages = filled
    logs.create_log_stream(logGroupName=group, logStreamName="other-1")
    logs.put_log_events(logGroupName=group, logStreamName="other-1",
                        logEvents=[{"timestamp": int(time.time() * 1000), "message": "other ERROR disk full"}])
    want = [m for m in messages if "ERROR" in m]
    r = logs.filter_log_events(logGroupName=group, logStreamNames=["main"], filterPattern="ERROR")
    assert [e["message"] for e in r["events"]] == want
    assert all(e["logStreamName"] == "main" and e["eventId"] for e in r["events"])
    assert "nextToken" not in r

    r = logs.filter_log_events(logGroupName=group, logStreamNamePrefix="other", filterPattern='"disk full"')
    assert [(e["logStreamName"], e["message"]) for e in r["events"]] == [("other-1", "other ERROR disk full")]
    assert [s["logStreamName"] for s in r["searchedLogStreams"]] == ["other-1"]

    r = logs.filter_log_events(logGroupName=group, filterPattern="ERROR -disk")
    assert [e["message"] for e in r["events"]] == want

    # Paging through everything with the paginator collects every event of both streams once.
    pages = logs.get_paginator("filter_log_events").paginate(logGroupName=group, PaginationConfig={"PageSize": 700})
    total = sum(len(p["events"]) for p in pages)
    assert total == len(messages) + 1


def test_describe_log_streams_ordering(logs):
    group = "/kiln/test/" + _name("order")
    logs.create_log_group(logGroupName=group)
    now = int(time.time() * 1000)
    for name, ts in [("b", now - 3000), ("c", now - 1000), ("a", now - 2000)]:
        logs.create_log_stream(logGroupName=group, logStreamName=name)
        logs.put_log_events(logGroupName=group, logStreamName=name, logEvents=[{"timestamp": ts, "message": name}])
    logs.create_log_stream(logGroupName=group, logStreamName="aa-empty")

    def names(**kw):
        return [s["logStreamName"] for s in logs.describe_log_streams(logGroupName=group, **kw)["logStreams"]]

    assert names() == ["a", "aa-empty", "b", "c"]
    assert names(descending=True) == ["c", "b", "aa-empty", "a"]
    assert names(logStreamNamePrefix="a") == ["a", "aa-empty"]
    with_events = [n for n in names(orderBy="LastEventTime") if n != "aa-empty"]
    assert with_events == ["b", "a", "c"]
    assert [n for n in names(orderBy="LastEventTime", descending=True) if n != "aa-empty"] == ["c", "a", "b"]

    r = logs.describe_log_streams(logGroupName=group, limit=2)
    assert len(r["logStreams"]) == 2 and r["nextToken"]
    r2 = logs.describe_log_streams(logGroupName=group, limit=2, nextToken=r["nextToken"])
    assert [s["logStreamName"] for s in r2["logStreams"]] == ["b", "c"]

    s = logs.describe_log_streams(logGroupName=group, logStreamNamePrefix="c")["logStreams"][0]
    assert s["firstEventTimestamp"] == s["lastEventTimestamp"] == now - 1000
    assert s["lastIngestionTime"] >= s["creationTime"]
    assert s["arn"].endswith(":log-group:%s:log-stream:c" % group)

    g = logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"]
    assert [x["logGroupName"] for x in g] == [group]
    assert g[0]["arn"] == "arn:aws:logs:us-east-1:000000000000:log-group:%s:*" % group

    logs.delete_log_stream(logGroupName=group, logStreamName="a")
    assert names() == ["aa-empty", "b", "c"]
    logs.delete_log_group(logGroupName=group)
    assert logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"] == []


def test_errors(logs):
    group = "/kiln/test/" + _name("err")
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName="s")

    cases = [
        (lambda: logs.create_log_group(logGroupName=group), "ResourceAlreadyExistsException",
         "The specified log group already exists"),
        (lambda: logs.create_log_stream(logGroupName=group, logStreamName="s"), "ResourceAlreadyExistsException", None),
        (lambda: logs.create_log_group(logGroupName="bad name!"), "InvalidParameterException", None),
        (lambda: logs.create_log_stream(logGroupName=group, logStreamName="a:b"), "InvalidParameterException", None),
        (lambda: logs.describe_log_streams(logGroupName=group + "-nope"), "ResourceNotFoundException",
         "The specified log group does not exist."),
        (lambda: logs.get_log_events(logGroupName=group, logStreamName="nope"), "ResourceNotFoundException",
         "The specified log stream does not exist."),
        (lambda: logs.get_log_events(logGroupName=group + "-nope", logStreamName="s"), "ResourceNotFoundException",
         "The specified log group does not exist."),
        (lambda: logs.describe_log_streams(logGroupName=group, logStreamNamePrefix="s", orderBy="LastEventTime"),
         "InvalidParameterException", None),
        (lambda: logs.describe_log_streams(logGroupName=group, limit=51), "InvalidParameterException", None),
        (lambda: logs.describe_log_groups(limit=51), "InvalidParameterException", None),
        (lambda: logs.get_log_events(logGroupName=group, logStreamName="s", limit=10001), "InvalidParameterException",
         None),
        (lambda: logs.get_log_events(logGroupName=group, logStreamName="s", nextToken="f/not-a-token"),
         "InvalidParameterException", None),
        (lambda: logs.filter_log_events(logGroupName=group, logStreamNames=["s"], logStreamNamePrefix="s"),
         "InvalidParameterException", None),
        (lambda: logs.filter_log_events(logGroupName=group + "-nope"), "ResourceNotFoundException", None),
        (lambda: logs.put_log_events(logGroupName=group, logStreamName="s", logEvents=[
            {"timestamp": 2000, "message": "b"}, {"timestamp": 1000, "message": "a"}]), "InvalidParameterException", None),
        (lambda: logs.put_log_events(logGroupName=group, logStreamName="s", logEvents=[
            {"timestamp": 1000, "message": "x" * (256 * 1024 + 1)}]), "InvalidParameterException", None),
        (lambda: logs.put_log_events(logGroupName=group, logStreamName="s", logEvents=[
            {"timestamp": 1000, "message": "x"}] * 10001), "InvalidParameterException", None),
        (lambda: logs.put_log_events(logGroupName=group, logStreamName="s", logEvents=[
            {"timestamp": 1000, "message": "x" * 200_000}] * 6), "InvalidParameterException", None),
        (lambda: logs.put_log_events(logGroupName=group, logStreamName="nope", logEvents=[
            {"timestamp": 1000, "message": "x"}]), "ResourceNotFoundException", "The specified log stream does not exist."),
        (lambda: logs.delete_log_stream(logGroupName=group, logStreamName="nope"), "ResourceNotFoundException", None),
        (lambda: logs.delete_log_group(logGroupName=group + "-nope"), "ResourceNotFoundException", None),
    ]
    for i, (call, code, message) in enumerate(cases):
        with pytest.raises(ClientError) as excinfo:
            call()
        got_code, got_message = _error(excinfo)
        assert got_code == code, (i, got_code, got_message)
        assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400, i
        if message is not None:
            assert got_message == message, (i, got_message)
    # Nothing from the rejected batches was stored.
    assert logs.get_log_events(logGroupName=group, logStreamName="s", startFromHead=True)["events"] == []


def test_restart_keeps_events(kiln_factory):
    srv = kiln_factory("logs-restart")
    logs = srv.client("logs")
    logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="job/algo-1-1")
    base = int(time.time() * 1000) - 10_000
    messages = ["line %d" % i for i in range(1200)]
    _put_all(logs, "/aws/sagemaker/TrainingJobs", "job/algo-1-1", messages, base, batch=500)
    first = logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="job/algo-1-1",
                                startFromHead=True, limit=700)

    srv.restart()
    logs = srv.client("logs")

    # The token from before the restart still continues where it left off.
    rest = logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="job/algo-1-1",
                               nextToken=first["nextForwardToken"])
    assert [e["message"] for e in first["events"] + rest["events"]] == messages
    s = logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs")["logStreams"][0]
    assert s["firstEventTimestamp"] == base and s["lastEventTimestamp"] == base + 1199
    logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="job/algo-1-1",
                        logEvents=[{"timestamp": base + 2000, "message": "after restart"}])
    tail = logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="job/algo-1-1", limit=2)
    assert [e["message"] for e in tail["events"]] == ["line 1199", "after restart"]
