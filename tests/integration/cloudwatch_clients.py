"""CloudWatch clients for test_cloudwatch.py, one per protocol Kiln serves:

  * AWS JSON 1.0 — boto3/botocore 1.43 from the SageMaker SDK bundle (it ranks `json` first);
    with protocol="smithy-rpc-v2-cbor" the same botocore is made to rank CBOR first, as SDKs that
    take the model's first protocol do, so botocore's own RPC v2 CBOR serializer and parser check
    Kiln's CBOR. It runs in a subprocess (`python3 cloudwatch_clients.py` reading calls on stdin), because the
    pytest process has Debian's boto3 1.26 imported and a module cannot be swapped back
    (see sdk_helpers.py).
  * AWS Query — Debian's boto3 1.26 (its CloudWatch model is query-only) in the pytest process, and
    the AWS CLI 2.9.
  * Smithy RPC v2 CBOR — raw HTTP: Debian's python3-cbor2 encodes and decodes, botocore's SigV4Auth
    signs for `monitoring`.

Answers are normalized (datetimes → epoch seconds, ResponseMetadata dropped) so they compare equal
across clients.
"""

import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CBOR_PATH = "/service/GraniteServiceVersion20100801/operation/"
TIMESTAMP_MEMBERS = {"StartTime", "EndTime", "Timestamp"}


def normalize(value):
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return round(value.timestamp(), 3)
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k != "ResponseMetadata"}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    return value


def sorted_datapoints(answer):
    """GetMetricStatistics' Datapoints are unordered (AWS): sorted by Timestamp for comparing."""
    out = dict(answer)
    out["Datapoints"] = sorted(answer.get("Datapoints", []), key=lambda d: d["Timestamp"])
    return out


# ---------------------------------------------------------------------------------------------
# JSON 1.0 through botocore 1.43 (subprocess)


def sdk_lib_dir():
    from sdk_helpers import sdk_lib_dir as find
    return find()


def json10_calls(server, calls, timeout=120, protocol=None):
    """Runs [(operation, params)] with boto3 1.43 in a subprocess; returns, per call, the
    normalized answer or {"Error": {...}, "HTTPStatusCode": n}. Timestamps in params are epoch
    seconds."""
    lib = sdk_lib_dir()
    if lib is None:
        import pytest
        pytest.skip("the SageMaker SDK bundle (boto3 1.43) is not present")
    request = {"lib": lib, "endpoint": server.endpoint, "key": server.access_key, "secret": server.secret_key,
               "calls": [[op, params] for op, params in calls], "protocol": protocol}
    p = subprocess.run(["/usr/bin/python3", os.path.abspath(__file__)], input=json.dumps(request),
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("boto3 1.43 client failed:\n%s\n%s" % (p.stdout, p.stderr))
    out = json.loads(p.stdout)
    assert out["botocore"].startswith("1.43"), out["botocore"]
    assert out["protocol"] == (protocol or "json"), out["protocol"]
    return out["results"]


def _subprocess_main():
    request = json.load(sys.stdin)
    sys.path.insert(0, request["lib"])
    import boto3
    import botocore
    import botocore.model
    from botocore.config import Config
    if request.get("protocol"):
        # The client's protocol preference (not the server's): only this one protocol.
        botocore.model.PRIORITY_ORDERED_SUPPORTED_PROTOCOLS = (request["protocol"],)
    from botocore.exceptions import ClientError
    client = boto3.session.Session().client(
        "cloudwatch", endpoint_url=request["endpoint"], aws_access_key_id=request["key"],
        aws_secret_access_key=request["secret"], region_name="us-east-1",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}))
    results = []
    for op, params in request["calls"]:
        method = getattr(client, botocore.xform_name(op))
        try:
            results.append(normalize(method(**params)))
        except ClientError as e:
            error = dict(e.response["Error"])
            error["ExceptionClass"] = type(e).__name__
            results.append({"Error": error, "HTTPStatusCode": e.response["ResponseMetadata"]["HTTPStatusCode"]})
    json.dump({"botocore": botocore.__version__, "protocol": client.meta.service_model.resolved_protocol,
               "results": results}, sys.stdout)


# ---------------------------------------------------------------------------------------------
# Query through Debian's boto3 1.26 and the AWS CLI


def query_client(server):
    import kiln_harness as kh
    return kh.make_client("cloudwatch", server.endpoint, server.access_key, server.secret_key)


def query_call(client, op, params):
    """Like json10_calls for one call, in-process with Debian's boto3."""
    import botocore
    from botocore.exceptions import ClientError
    try:
        return normalize(getattr(client, botocore.xform_name(op))(**params))
    except ClientError as e:
        return {"Error": dict(e.response["Error"]), "HTTPStatusCode": e.response["ResponseMetadata"]["HTTPStatusCode"]}


def cli_json(aws, *args):
    """`aws cloudwatch ...` → its JSON output with ISO timestamps as epoch seconds."""
    p = aws("cloudwatch", *args, "--output", "json")
    return _iso_to_epoch(json.loads(p.stdout))


def _iso_to_epoch(value):
    if isinstance(value, dict):
        return {k: (_parse_iso(v) if k in ("Timestamp",) and isinstance(v, str) else _iso_to_epoch(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_iso_to_epoch(v) for v in value]
    return value


def _parse_iso(text):
    return round(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp(), 3)


def iso(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# RPC v2 CBOR, raw


def _tag_timestamps(value):
    import cbor2
    if isinstance(value, dict):
        return {k: (cbor2.CBORTag(1, v) if k in TIMESTAMP_MEMBERS and isinstance(v, (int, float))
                    else _tag_timestamps(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_tag_timestamps(v) for v in value]
    return value


def cbor_call(server, op, params=None, raw_body=None, headers=None):
    """POSTs `params` (timestamps as epoch seconds, sent as tag 1) or `raw_body` to the RPC v2 CBOR
    path, signed for monitoring. Returns (status, lower-cased headers, decoded body or None)."""
    import cbor2
    import kiln_harness as kh
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    body = raw_body if raw_body is not None else (cbor2.dumps(_tag_timestamps(params)) if params is not None else b"")
    url = server.endpoint + CBOR_PATH + op
    hdrs = {"smithy-protocol": "rpc-v2-cbor", "Accept": "application/cbor"}
    if body:
        hdrs["Content-Type"] = "application/cbor"
    hdrs.update(headers or {})
    req = AWSRequest(method="POST", url=url, data=body, headers=hdrs)
    SigV4Auth(Credentials(server.access_key, server.secret_key), "monitoring", "us-east-1").add_auth(req)
    status, resp_headers, data = kh.http_request("POST", url, dict(req.headers.items()), body)
    decoded = cbor2.loads(data) if data else None
    return status, resp_headers, normalize(decoded) if decoded is not None else None


if __name__ == "__main__":
    _subprocess_main()
