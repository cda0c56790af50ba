#!/usr/bin/env python3
"""Writes src/api/models/sagemaker.json: botocore's SageMaker service model without documentation.

Kiln validates every SageMaker request against this model (src/api/service_model.h). The file is
committed so that a build machine needs no botocore; rerun this script (with a botocore that has
the wanted API version) to update it:

    python3 scripts/extract-service-model.py [--service sagemaker] [--out src/api/models/sagemaker.json]

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


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service", default="sagemaker")
    parser.add_argument("--out", default=None)
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
