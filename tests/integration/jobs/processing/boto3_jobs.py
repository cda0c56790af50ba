"""The programs of test_processing.py's boto3 jobs: `python3 boto3_jobs.py MODE ARGS...`, staged
from S3 into /opt/ml/processing/input/code (as the SDK stages its code input).

  ok        prints its arguments and $GREETING, copies the Pipe input's FIFO
            /opt/ml/processing/input/piped_0 to output/result/piped.txt, lists the files of
            /opt/ml/processing/input/manifest into output/result/manifest.json, writes
            output/result/nested/answer.txt and /opt/ml/output/message, exits 0
  fail      writes output/partial.txt, prints a line, an error to stderr, exits 3
  failfile  writes /opt/ml/output/failure, exits 1
  badmsg    writes bytes that are not UTF-8 to /opt/ml/output/message, exits 0
  stop      prints "running", sleeps; on SIGTERM prints so and exits 143
  ticks     N times, a second apart: prints "tick i" and writes output/ticks/tick-i.txt; then
            writes /opt/ml/output/message and exits 0
"""

import json
import os
import signal
import sys
import time


def ok(args):
    print("ok-job: args=%s" % json.dumps(args), flush=True)
    print("ok-job: greeting=%s" % os.environ.get("GREETING"), flush=True)
    os.makedirs("/opt/ml/processing/output/result/nested", exist_ok=True)
    with open("/opt/ml/processing/input/piped_0", "rb") as fifo, \
            open("/opt/ml/processing/output/result/piped.txt", "wb") as f:
        f.write(fifo.read())
    listed = {}
    for root, _, files in os.walk("/opt/ml/processing/input/manifest"):
        for name in files:
            with open(os.path.join(root, name)) as f:
                listed[os.path.relpath(os.path.join(root, name), "/opt/ml/processing/input/manifest")] = f.read()
    with open("/opt/ml/processing/output/result/manifest.json", "w") as f:
        json.dump(listed, f)
    with open("/opt/ml/processing/output/result/nested/answer.txt", "w") as f:
        f.write("42\n")
    with open("/opt/ml/output/message", "w") as f:
        f.write("processed 42 rows")


def fail(args):
    with open("/opt/ml/processing/output/partial.txt", "w") as f:
        f.write("written before failing\n")
    print("fail-job: about to fail", flush=True)
    print("ValueError: column 'price' has negative values", file=sys.stderr, flush=True)
    sys.exit(3)


def failfile(args):
    with open("/opt/ml/output/failure", "w") as f:
        f.write("ClientError: the input has no header row")
    sys.exit(1)


def badmsg(args):
    with open("/opt/ml/output/message", "wb") as f:
        f.write(b"done \xff\xfe")


def stop(args):
    def on_term(signum, frame):
        print("stop-job: got SIGTERM", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    print("stop-job: running", flush=True)
    time.sleep(300)


def ticks(args):
    os.makedirs("/opt/ml/processing/output/ticks", exist_ok=True)
    for i in range(int(args[0])):
        with open("/opt/ml/processing/output/ticks/tick-%d.txt" % i, "w") as f:
            f.write("%d\n" % i)
        print("tick %d" % i, flush=True)
        time.sleep(1)
    with open("/opt/ml/output/message", "w") as f:
        f.write("ticked %s times" % args[0])


if __name__ == "__main__":
    MODES = {"ok": ok, "fail": fail, "failfile": failfile, "badmsg": badmsg, "stop": stop, "ticks": ticks}
    MODES[sys.argv[1]](sys.argv[2:])
