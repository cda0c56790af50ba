#!/usr/bin/env python3
"""Writes src/api/models/<service>.json: a botocore service model without documentation.

Kiln validates every SageMaker request against this model (src/api/service_model.h). The file is
committed so that a build machine needs no botocore; rerun this script (with a botocore that has
the wanted API version) to update it:

    python3 scripts/extract-service-model.py [--service sagemaker] [--out src/api/models/sagemaker.json]
    python3 scripts/extract-service-model.py --service cloudwatch \
        --operations PutMetricData,GetMetricStatistics,GetMetricData,ListMetrics

--operations keeps only the named operations and the shapes they reach (inputs, outputs, errors),
for services of which Kiln serves a few operations (the CloudWatch model is ~40 operations).

Only documentation and other doc-only members are dropped; shapes, constraints and member order
are kept exactly (member order decides the order of validation errors).
"""
import argparse
import glob
import gzip
import json
import os
import sys

# Members that only feed documentation or code generators, never validation.
DOC_ONLY_KEYS = {"documentation", "documentationUrl", "deprecatedMessage", "examples"}


def strip(node):
    if isinstance(node, dict):
        return {key: strip(value) for key, value in node.items() if key not in DOC_ONLY_KEYS}
    if isinstance(node, list):
        return [strip(value) for value in node]
    return node


def trim(model, operations):
    """Keeps `operations` and every shape reachable from them."""
    missing = [op for op in operations if op not in model["operations"]]
    if missing:
        sys.exit(f"unknown operations: {', '.join(missing)}")
    model["operations"] = {name: op for name, op in model["operations"].items() if name in operations}
    keep, todo = set(), []
    for op in model["operations"].values():
        for ref in [op.get("input"), op.get("output")] + op.get("errors", []):
            if ref:
                todo.append(ref["shape"])
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        shape = model["shapes"][name]
        refs = list(shape.get("members", {}).values())
        refs += [shape[key] for key in ("member", "key", "value") if key in shape]
        todo += [ref["shape"] for ref in refs]
    model["shapes"] = {name: shape for name, shape in model["shapes"].items() if name in keep}
    return model


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service", default="sagemaker")
    parser.add_argument("--out", default=None)
    parser.add_argument("--operations", default=None, help="comma-separated operations to keep (default: all)")
    args = parser.parse_args()
    out = args.out or os.path.join(repo, "src", "api", "models", args.service + ".json")

    import botocore  # the pre-installed one; CI uses the committed output

    data_dir = os.path.join(os.path.dirname(botocore.__file__), "data", args.service)
    versions = sorted(glob.glob(os.path.join(data_dir, "*", "service-2.json*")))
    if not versions:
        sys.exit(f"no service model for {args.service} under {data_dir}")
    path = versions[-1]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        model = json.load(f)
    model = strip(model)
    if args.operations:
        model = trim(model, [op for op in args.operations.split(",") if op])
    model.setdefault("metadata", {})["kilnSource"] = f"botocore {botocore.__version__}"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(model, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, out)
    print(f"{out}: {os.path.getsize(out)} bytes from {path} (botocore {botocore.__version__})")


if __name__ == "__main__":
    main()
