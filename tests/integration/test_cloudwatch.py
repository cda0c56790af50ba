"""CloudWatch metrics (issue 10, spec/control-plane-api.md §13) on Kiln's one port: the same
operations answered identically in every protocol clients use — AWS JSON 1.0 (boto3 1.43 from the
SageMaker SDK bundle), AWS Query (Debian's boto3 1.26 and the AWS CLI 2.9) and Smithy RPC v2 CBOR
(raw, python3-cbor2) — plus paging, AWS's errors for bad input in each protocol, and endpoint
invocation metrics in AWS/SageMaker.
"""

import json
import subprocess
import time

import pytest

import cloudwatch_clients as cw
import endpoint_helpers as eh
import kiln_harness as kh
from training_helpers import sm, s3  # noqa: F401 (module-scoped fixtures)

KILN_CONFIG = eh.ENDPOINT_CONFIG
NS = "KilnTest/CloudWatch"
DIMS = [{"Name": "Host", "Value": "algo-1"}, {"Name": "Job", "Value": "cw-1"}]


@pytest.fixture(scope="module")
def query(module_kiln):
    return cw.query_client(module_kiln)


@pytest.fixture(scope="module")
def cli(module_kiln, tmp_path_factory):
    path = kh.aws_cli()
    if not path:
        pytest.skip("no AWS CLI (/usr/bin/aws)")
    home = str(tmp_path_factory.mktemp("awshome"))
    env = module_kiln.aws_env(home)

    def run(*args, check=True):
        cmd = [path, "--endpoint-url", module_kiln.endpoint, "--no-cli-pager"] + [str(a) for a in args]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        if check and p.returncode != 0:
            raise AssertionError("%s failed (%d)\n%s\n%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
        return p
    return run


@pytest.fixture(scope="module")
def now():
    # Whole minutes, so the periods the data falls in are known.
    return float(int(time.time()) // 60 * 60)


@pytest.fixture(scope="module")
def latency_data(module_kiln, now):
    """Points in three minutes written through JSON 1.0 (boto3 1.43): single values, Values+Counts
    and a statistic set."""
    data = [
        {"MetricName": "Latency", "Dimensions": DIMS, "Timestamp": now - 300 + 5, "Value": 13.5, "Unit": "Milliseconds"},
        {"MetricName": "Latency", "Dimensions": DIMS, "Timestamp": now - 300 + 30, "Values": [1, 2, 40],
         "Counts": [3, 1, 1], "Unit": "Milliseconds"},
        {"MetricName": "Latency", "Dimensions": DIMS, "Timestamp": now - 240 + 1, "Values": [7, 8, 9],
         "Unit": "Milliseconds"},
        {"MetricName": "Latency", "Dimensions": DIMS, "Timestamp": now - 120 + 59,
         "StatisticValues": {"SampleCount": 4, "Sum": 20, "Minimum": 5, "Maximum": 5}, "Unit": "Milliseconds"},
    ]
    [answer] = cw.json10_calls(module_kiln, [("PutMetricData", {"Namespace": NS, "MetricData": data})])
    assert "Error" not in answer, answer
    return data


def stats_params(now, **extra):
    params = {"Namespace": NS, "MetricName": "Latency", "Dimensions": DIMS, "StartTime": now - 600,
              "EndTime": now, "Period": 60, "Statistics": ["SampleCount", "Average", "Sum", "Minimum", "Maximum"]}
    params.update(extra)
    return params


def cli_stats_args(params):
    args = ["get-metric-statistics", "--namespace", params["Namespace"], "--metric-name", params["MetricName"],
            "--start-time", cw.iso(params["StartTime"]), "--end-time", cw.iso(params["EndTime"]),
            "--period", params["Period"]]
    if params.get("Statistics"):
        args += ["--statistics"] + params["Statistics"]
    if params.get("ExtendedStatistics"):
        args += ["--extended-statistics"] + params["ExtendedStatistics"]
    if params.get("Dimensions"):
        args += ["--dimensions"] + ["Name=%s,Value=%s" % (d["Name"], d["Value"]) for d in params["Dimensions"]]
    return args


def test_same_statistics_through_every_protocol(module_kiln, query, cli, latency_data, now):
    for params in (stats_params(now), stats_params(now, Statistics=None, ExtendedStatistics=["p50", "p99.9"])):
        params = {k: v for k, v in params.items() if v is not None}
        [json10] = cw.json10_calls(module_kiln, [("GetMetricStatistics", params)])
        via_query = cw.query_call(query, "GetMetricStatistics", params)
        via_cli = cw.cli_json(cli, *cli_stats_args(params))
        [via_botocore_cbor] = cw.json10_calls(module_kiln, [("GetMetricStatistics", params)],
                                              protocol="smithy-rpc-v2-cbor")
        status, headers, via_cbor = cw.cbor_call(module_kiln, "GetMetricStatistics", params)
        assert status == 200, via_cbor
        assert headers["smithy-protocol"] == "rpc-v2-cbor"
        expected = cw.sorted_datapoints(json10)
        assert len(expected["Datapoints"]) == 3, expected
        assert expected["Label"] == "Latency"
        for name, other in (("query (boto3 1.26)", via_query), ("query (aws cli)", via_cli), ("cbor", via_cbor),
                            ("cbor (botocore 1.43)", via_botocore_cbor)):
            assert cw.sorted_datapoints(other) == expected, name
    # The values themselves, from what was written (period starts at whole minutes).
    first, second, third = expected["Datapoints"]
    assert first["Timestamp"] == now - 300
    assert first["ExtendedStatistics"] == {"p50": 1.0, "p99.9": 40.0}  # 13.5, 1x3, 2, 40 → sorted 1,1,1,2,13.5,40
    assert second["ExtendedStatistics"] == {"p50": 8.0, "p99.9": 9.0}
    assert third["ExtendedStatistics"] == {"p50": 5.0, "p99.9": 5.0}  # Minimum == Maximum: percentiles exist
    [full] = cw.json10_calls(module_kiln, [("GetMetricStatistics", stats_params(now))])
    by_time = {d["Timestamp"]: d for d in full["Datapoints"]}
    assert by_time[now - 300] == {"Timestamp": now - 300, "SampleCount": 6.0, "Sum": 58.5, "Average": 9.75,
                                  "Minimum": 1.0, "Maximum": 40.0, "Unit": "Milliseconds"}
    assert by_time[now - 120]["Average"] == 5.0
    # Each client really spoke its protocol (the access log names it).
    log = module_kiln.log_text()
    for protocol in ("json-1.0", "query"):
        assert "service=monitoring protocol=%s operation=GetMetricStatistics" % protocol in log, protocol
    assert "path=/service/GraniteServiceVersion20100801/operation/GetMetricStatistics" in log


def test_get_metric_data_paging_and_order(module_kiln, query, latency_data, now):
    def q(qid, stat):
        return {"Id": qid, "MetricStat": {"Metric": {"Namespace": NS, "MetricName": "Latency", "Dimensions": DIMS},
                                          "Period": 60, "Stat": stat}}
    params = {"MetricDataQueries": [q("avg", "Average"), q("p90", "p90"), q("n", "SampleCount")],
              "StartTime": now - 600, "EndTime": now, "ScanBy": "TimestampAscending"}
    [whole] = cw.json10_calls(module_kiln, [("GetMetricData", params)])
    results = {r["Id"]: r for r in whole["MetricDataResults"]}
    assert results["avg"]["Timestamps"] == [now - 300, now - 240, now - 120]
    assert results["avg"]["Values"] == [9.75, 8.0, 5.0]
    assert results["p90"]["Values"] == [40.0, 9.0, 5.0]
    assert results["n"]["Values"] == [6.0, 3.0, 4.0]
    assert all(r["StatusCode"] == "Complete" and r["Label"] == "Latency" for r in results.values())
    assert "NextToken" not in whole

    # Two values per page, through the query protocol: PartialData until each series is done.
    paged = dict(params, MaxDatapoints=2)
    collected = {"avg": [], "p90": [], "n": []}
    pages = 0
    while True:
        page = cw.query_call(query, "GetMetricData", paged)
        assert "Error" not in page, page
        pages += 1
        for r in page["MetricDataResults"]:
            collected[r["Id"]] += r.get("Values", [])
            assert r["StatusCode"] == ("Complete" if len(collected[r["Id"]]) == 3 else "PartialData"), page
        if "NextToken" not in page:
            break
        assert pages < 10
        paged["NextToken"] = page["NextToken"]
    assert pages == 5
    assert collected == {k: results[k]["Values"] for k in collected}

    [via_cbor] = cw.json10_calls(module_kiln, [("GetMetricData", params)], protocol="smithy-rpc-v2-cbor")
    assert via_cbor == whole

    # Descending by default, through CBOR.
    status, _, desc = cw.cbor_call(module_kiln, "GetMetricData", {k: v for k, v in params.items() if k != "ScanBy"})
    assert status == 200, desc
    assert desc["MetricDataResults"][0]["Timestamps"] == [now - 120, now - 240, now - 300]


def test_list_metrics_paging_and_filters(module_kiln, query, now):
    ns = NS + "/Many"
    calls = []
    for chunk in range(3):
        calls.append(("PutMetricData", {"Namespace": ns, "MetricData": [
            {"MetricName": "m%04d" % (chunk * 400 + i), "Dimensions": [{"Name": "Shard", "Value": str(i % 2)}],
             "Value": 1} for i in range(400)]}))
    assert all("Error" not in a for a in cw.json10_calls(module_kiln, calls))
    pages = list(query.get_paginator("list_metrics").paginate(Namespace=ns))
    assert [len(p["Metrics"]) for p in pages] == [500, 500, 200]
    names = [m["MetricName"] for p in pages for m in p["Metrics"]]
    assert names == sorted(names) and len(set(names)) == 1200
    shard1 = list(query.get_paginator("list_metrics").paginate(
        Namespace=ns, Dimensions=[{"Name": "Shard", "Value": "1"}]))
    assert sum(len(p["Metrics"]) for p in shard1) == 600
    [recent, other] = cw.json10_calls(module_kiln, [
        ("ListMetrics", {"Namespace": ns, "MetricName": "m0007", "RecentlyActive": "PT3H"}),
        ("ListMetrics", {"Namespace": ns + "-nothing"})])
    assert recent["Metrics"] == [{"Namespace": ns, "MetricName": "m0007", "Dimensions": [{"Name": "Shard", "Value": "1"}]}]
    assert other["Metrics"] == []
    status, _, page = cw.cbor_call(module_kiln, "ListMetrics", {"Namespace": ns})
    assert status == 200 and len(page["Metrics"]) == 500 and page["NextToken"]


def error_of(answer):
    return answer.get("Error", {}).get("Code"), answer.get("Error", {}).get("Message", "")


def test_errors_are_aws_shaped_in_every_protocol(module_kiln, query, cli, now):
    cases = [
        # (operation, params, code, text in the message)
        ("PutMetricData", {"Namespace": "AWS/SageMaker", "MetricData": [{"MetricName": "x", "Value": 1}]},
         "InvalidParameterValue", "The value AWS/SageMaker for parameter Namespace is invalid"),
        ("PutMetricData", {"Namespace": NS, "MetricData": [{"MetricName": "x", "Value": 1, "StatisticValues": {
            "SampleCount": 1, "Sum": 1, "Minimum": 1, "Maximum": 1}}]},
         "InvalidParameterCombination", "are mutually exclusive"),
        ("PutMetricData", {"Namespace": NS, "MetricData": [{"MetricName": "x", "Values": [1, 2], "Counts": [1]}]},
         "InvalidParameterValue", "must be of the same size"),
        ("GetMetricStatistics", stats_params(now, Statistics=["Sum", "Median"]), "InvalidParameterValue",
         "The parameter Statistics.member.2 must be a value in the set [ Minimum, Maximum, Average, SampleCount, Sum ]."),
        ("GetMetricStatistics", stats_params(now, Statistics=None, ExtendedStatistics=["p101"]),
         "InvalidParameterValue", "ExtendedStatistics.member.1"),
        ("GetMetricStatistics", stats_params(now, StartTime=now - 86400 * 2), "InvalidParameterCombination",
         "You have requested up to 2,880 datapoints, which exceeds the limit of 1,440."),
        ("GetMetricStatistics", stats_params(now, Period=45), "InvalidParameterValue", "Period"),
        ("GetMetricStatistics", stats_params(now, StartTime=now - 4 * 3600, Period=10), "InvalidParameterValue",
         "multiple of 60 when StartTime is more than 3 hours ago"),
        ("GetMetricStatistics", stats_params(now, StartTime=now - 20 * 86400, EndTime=now - 19 * 86400, Period=60),
         "InvalidParameterValue", "multiple of 300"),
        ("GetMetricData", {"MetricDataQueries": [{"Id": "e1", "Expression": "SUM(METRICS())"}],
                           "StartTime": now - 600, "EndTime": now}, "ValidationError", "Unsupported Metric Math function: METRICS"),
    ]
    calls = [(op, {k: v for k, v in p.items() if v is not None}) for op, p, _, _ in cases]
    json10 = cw.json10_calls(module_kiln, calls)
    botocore_cbor = cw.json10_calls(module_kiln, calls, protocol="smithy-rpc-v2-cbor")
    for (op, params, code, text), j, bc in zip(cases, json10, botocore_cbor):
        params = {k: v for k, v in params.items() if v is not None}
        q = cw.query_call(query, op, params)
        status, headers, c = cw.cbor_call(module_kiln, op, params)
        for name, (got, message) in (("json 1.0", error_of(j)), ("query", error_of(q)), ("botocore cbor", error_of(bc)),
                                     ("cbor", (c.get("__type"), c.get("message", "")))):
            assert got == code, (name, op, params, j, q, c)
            assert text in message, (name, message)
        assert status == 400 and headers["x-amzn-query-error"] == code + ";Sender"
        assert j["HTTPStatusCode"] == 400
    # Modelled errors map onto the SDK's exception classes.
    assert json10[0]["Error"]["ExceptionClass"] == "InvalidParameterValueException"
    assert botocore_cbor[0]["Error"]["ExceptionClass"] == "InvalidParameterValueException"
    # The CLI shows the same code and message.
    p = cli("cloudwatch", *cli_stats_args(stats_params(now, StartTime=now - 86400 * 2)), check=False)
    assert p.returncode != 0 and "(InvalidParameterCombination)" in p.stderr and "2,880 datapoints" in p.stderr


def test_malformed_bodies_leave_the_server_unaffected(module_kiln):
    for body in (b"\xa1\x61", b"\xff", b"\x9f" * 100000, b"\xa1\x61a\xc2\x41\x00", b"\x01", b"\x5a\xff\xff\xff\xff"):
        status, headers, decoded = cw.cbor_call(module_kiln, "ListMetrics", raw_body=body)
        assert status == 400, (body[:8], decoded)
        assert decoded["__type"] == "SerializationException"
        assert headers["x-amzn-query-error"] == "SerializationException;Sender"
    status, _, decoded = cw.cbor_call(module_kiln, "SetAlarmState", params={})
    assert status == 404 and decoded["__type"] == "UnknownOperationException"

    def form(body):
        return kh.signed_request(module_kiln, "POST", "/", service="monitoring", body=body.encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    for body, code in (("Action=ListMetrics&Version=2010-08-01&Namespace=%zz", "MalformedQueryString"),
                       ("Action=GetMetricStatistics&Version=2010-08-01&Namespace=n&MetricName=m&Period=sixty"
                        "&StartTime=2024-01-01T00:00:00Z&EndTime=2024-01-01T01:00:00Z&Statistics.member.1=Sum",
                        "InvalidParameterValue"),
                       ("Action=ListMetrics&Version=2010-08-01&Dimensions.member.x.Name=a", "InvalidParameterValue"),
                       ("Version=2010-08-01", "MissingAction"),
                       ("Action=SetAlarmState&Version=2010-08-01", "InvalidAction")):
        status, _, data = form(body)
        assert status == 400, data
        assert kh.xml_error_code(data) == code, (body, data)
        assert b"http://monitoring.amazonaws.com/doc/2010-08-01/" in data
    # Still serving, all protocols.
    status, _, ok = cw.cbor_call(module_kiln, "ListMetrics", params={"Namespace": "none"})
    assert status == 200 and ok["Metrics"] == []
    assert module_kiln.healthy()


def test_endpoint_invocations_appear_in_aws_sagemaker(module_kiln, sm, query):
    name = eh.unique_name("ep-cw")
    eh.create_model(sm, name + "-m")
    eh.deploy(sm, name, [("AllTraffic", name + "-m", 1, 1.0)], server=module_kiln)
    try:
        rt = module_kiln.client("sagemaker-runtime")
        start = time.time()
        for _ in range(3):
            eh.invoke(rt, name, body=b'{"x": 1}')
        dims = [{"Name": "EndpointName", "Value": name}, {"Name": "VariantName", "Value": "AllTraffic"}]
        params = {"Namespace": "AWS/SageMaker", "Dimensions": dims, "StartTime": start - 120, "EndTime": time.time() + 60,
                  "Period": 60, "Statistics": ["Sum", "SampleCount"]}

        def total(metric, stat):
            r = query.get_metric_statistics(MetricName=metric, **params)
            return sum(d[stat] for d in r["Datapoints"])
        eh.wait_until(lambda: total("Invocations", "Sum") == 3, timeout=15)
        assert total("ModelLatency", "SampleCount") == 3
        listed = query.list_metrics(Namespace="AWS/SageMaker", Dimensions=[{"Name": "EndpointName", "Value": name}])
        assert {"Invocations", "ModelLatency", "OverheadLatency"} <= {m["MetricName"] for m in listed["Metrics"]}
        [via_json] = cw.json10_calls(module_kiln, [("GetMetricStatistics", dict(params, MetricName="Invocations"))])
        assert sum(d["Sum"] for d in via_json["Datapoints"]) == 3
    finally:
        sm.delete_endpoint(EndpointName=name)
        eh.wait_until(lambda: eh.endpoint_gone(sm, name), timeout=60)


def test_aws_cli_put_list_and_get_metric_data(module_kiln, cli, now):
    cli("cloudwatch", "put-metric-data", "--namespace", NS + "/Cli", "--metric-name", "Requests", "--unit", "Count",
        "--value", "3", "--dimensions", "Service=api", "--timestamp", cw.iso(now - 90))
    cli("cloudwatch", "put-metric-data", "--namespace", NS + "/Cli", "--metric-name", "Requests",
        "--statistic-values", "SampleCount=2,Sum=10,Minimum=4,Maximum=6", "--dimensions", "Service=api",
        "--timestamp", cw.iso(now - 80))
    listed = cw.cli_json(cli, "list-metrics", "--namespace", NS + "/Cli")
    assert listed["Metrics"] == [{"Namespace": NS + "/Cli", "MetricName": "Requests",
                                  "Dimensions": [{"Name": "Service", "Value": "api"}]}]
    queries = ('[{"Id": "total", "MetricStat": {"Metric": {"Namespace": "%s/Cli", "MetricName": "Requests", '
               '"Dimensions": [{"Name": "Service", "Value": "api"}]}, "Period": 60, "Stat": "Sum"}}, '
               '{"Id": "twice", "Expression": "total * 2"}]' % NS)
    out = json.loads(cli("cloudwatch", "get-metric-data", "--metric-data-queries", queries,
                         "--start-time", cw.iso(now - 600), "--end-time", cw.iso(now), "--output", "json").stdout)
    results = {r["Id"]: r for r in out["MetricDataResults"]}
    assert results["total"]["Values"] == [13.0] and results["twice"]["Values"] == [26.0]
    assert results["total"]["StatusCode"] == "Complete"
