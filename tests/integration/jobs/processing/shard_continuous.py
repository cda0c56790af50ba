"""The SKLearnProcessor's script in test_processing.py (two hosts, run as
`python3 /opt/ml/processing/input/code/shard_continuous.py ARGS...`).

Each host lists what its ShardedByS3Key input holds and writes that to
/opt/ml/processing/output/<host>/seen.json (a Continuous output), then waits, still running,
until the test has seen both hosts' files in S3 and put the marker object
s3://$MARKER_BUCKET/$MARKER_KEY; then it writes <host>/final.json and exits 0. Without the
marker within MARKER_WAIT_SECONDS it writes /opt/ml/output/message and exits 2.
"""

import hashlib
import json
import os
import sys
import time

import boto3
import sklearn  # what the scikit-learn image provides (Kiln: Debian's, through the built-in environment)
from botocore.exceptions import ClientError

DATA = "/opt/ml/processing/input/data"
OUT = "/opt/ml/processing/output"


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)


def main():
    with open("/opt/ml/config/resourceconfig.json") as f:
        host = json.load(f)["current_host"]
    seen = {}
    for root, _, files in os.walk(DATA):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                seen[os.path.relpath(path, DATA)] = hashlib.sha256(f.read()).hexdigest()
    os.makedirs(os.path.join(OUT, host), exist_ok=True)
    write_json(os.path.join(OUT, host, "seen.json"), {"host": host, "seen": seen, "argv": sys.argv[1:],
                                                     "sklearn": sklearn.__version__, "written_at": time.time()})
    print("shard_continuous: %s saw %d objects: %s" % (host, len(seen), " ".join(sorted(seen))), flush=True)

    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ["AWS_REGION"])
    bucket, key = os.environ["MARKER_BUCKET"], os.environ["MARKER_KEY"]
    deadline = time.time() + float(os.environ.get("MARKER_WAIT_SECONDS", "150"))
    while True:
        try:
            s3.head_object(Bucket=bucket, Key=key)
            break
        except ClientError:
            if time.time() > deadline:
                with open("/opt/ml/output/message", "w") as f:
                    f.write("%s: no marker s3://%s/%s\n" % (host, bucket, key))
                sys.exit(2)
            time.sleep(0.2)
    write_json(os.path.join(OUT, host, "final.json"), {"host": host, "count": len(seen), "marker_seen_at": time.time()})
    print("shard_continuous: %s saw the marker, done" % host, flush=True)


if __name__ == "__main__":
    main()
