#!/usr/bin/env python3
"""Writes the seeds of cbor_fuzzer and cloudwatch_fuzzer (fuzz/corpus/<target>/): one valid request
per CloudWatch operation in each protocol (byte 0 = the target's flags byte), plus CBOR documents
with every major type, indefinite lengths, tags and floats. Needs python3-cbor2 (Debian)."""
import json
import os

import cbor2

HERE = os.path.dirname(os.path.abspath(__file__))
NOW = 1714557600
OPS = ["PutMetricData", "GetMetricStatistics", "GetMetricData", "ListMetrics"]
DIMS = [{"Name": "Host", "Value": "h1"}]
REQUESTS = {
    "PutMetricData": {"Namespace": "App", "MetricData": [
        {"MetricName": "Latency", "Dimensions": DIMS, "Timestamp": NOW - 60, "Value": 1.5, "Unit": "Milliseconds"},
        {"MetricName": "Latency", "Values": [1, 2], "Counts": [3, 4], "StorageResolution": 1},
        {"MetricName": "Latency", "StatisticValues": {"SampleCount": 2, "Sum": 3, "Minimum": 1, "Maximum": 2}}]},
    "GetMetricStatistics": {"Namespace": "App", "MetricName": "Latency", "Dimensions": DIMS, "StartTime": NOW - 900,
                            "EndTime": NOW, "Period": 60, "Statistics": ["Average", "SampleCount"],
                            "ExtendedStatistics": ["p99"]},
    "GetMetricData": {"MetricDataQueries": [{"Id": "a", "MetricStat": {"Metric": {"Namespace": "App", "MetricName": "Latency",
                                                                                "Dimensions": DIMS},
                                                                     "Period": 60, "Stat": "p90"}, "Label": "l"}],
                      "StartTime": NOW - 900, "EndTime": NOW, "MaxDatapoints": 3, "ScanBy": "TimestampAscending"},
    "ListMetrics": {"Namespace": "App", "Dimensions": [{"Name": "Host"}], "RecentlyActive": "PT3H"},
}
TIMESTAMPS = {"StartTime", "EndTime", "Timestamp"}


def tagged(v):
    if isinstance(v, dict):
        return {k: cbor2.CBORTag(1, x) if k in TIMESTAMPS else tagged(x) for k, x in v.items()}
    if isinstance(v, list):
        return [tagged(x) for x in v]
    return v


def form(v, prefix=""):
    out = []
    if isinstance(v, dict):
        for k, x in v.items():
            out += form(x, prefix + "." + k if prefix else k)
    elif isinstance(v, list):
        for i, x in enumerate(v, 1):
            out += form(x, "%s.member.%d" % (prefix, i))
    else:
        out.append((prefix, str(v)))
    return out


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    import urllib.parse
    for i, op in enumerate(OPS):
        req = REQUESTS[op]
        write("cloudwatch_fuzzer", op + ".cbor", bytes([i << 2]) + cbor2.dumps(tagged(req)))
        write("cloudwatch_fuzzer", op + ".json", bytes([2 | i << 2]) + json.dumps(req).encode())
        q = [("Action", op), ("Version", "2010-08-01")] + form(req)
        write("cloudwatch_fuzzer", op + ".query", bytes([1 | i << 2]) + urllib.parse.urlencode(q).encode())
        write("cbor_fuzzer", op, bytes([2]) + cbor2.dumps(tagged(req)))
    samples = {
        "scalars": cbor2.dumps([0, 23, 24, 255, 65536, 2**40, -1, -1000, 1.5, True, False, None, "text", b"\x00\x01"]),
        "floats": b"\x83\xf9\x3c\x00\xfa\x47\xc3\x50\x00\xfb\x3f\xf1\x99\x99\x99\x99\x99\x9a",
        "indefinite": b"\xbf\x61a\x9f\x01\x02\xff\x61s\x7f\x62ab\x61c\xff\x61b\x5f\x41\x01\x41\x02\xff\xff",
        "tags": b"\xa2\x64When\xc1\x1a\x66\x32\x13\x60\x61L\x82\xc1\xfb\x41\xd9\x8c\x84\xd8\x00\x00\x00\xc1\x00",
        "nested": b"\x81" * 10 + b"\xa0",
        "shaped": cbor2.dumps({"When": cbor2.CBORTag(1, NOW), "V": 2, "N": 3.5, "B": "AAEC", "L": [cbor2.CBORTag(1, 1.5)],
                               "M": {"k": 1}, "S": {"When": "2024-05-01T10:00:00Z"}}),
    }
    for name, data in samples.items():
        write("cbor_fuzzer", name, bytes([2]) + data)
        write("cbor_fuzzer", name + "-small", bytes([3]) + data)


if __name__ == "__main__":
    main()
