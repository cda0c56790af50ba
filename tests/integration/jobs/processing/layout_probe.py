"""The ScriptProcessor's script in test_processing.py (two hosts, run as
`python3 /opt/ml/processing/input/code/layout_probe.py ARGS...`): reports what a processing
container sees — its argv and interpreter, its environment (secrets only as present/absent), the
/opt/ml tree, both config files verbatim, its input files and the other hosts' addresses — into
/opt/ml/processing/output/layout/<host>.json (an EndOfJob output).
"""

import json
import os
import socket
import sys

SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def read(path):
    with open(path) as f:
        return f.read()


def main():
    resource_text = read("/opt/ml/config/resourceconfig.json")
    resource = json.loads(resource_text)
    host = resource["current_host"]
    tree = []
    for root, dirs, files in os.walk("/opt/ml"):
        for name in dirs:
            tree.append(os.path.join(root, name) + "/")
        for name in files:
            tree.append(os.path.join(root, name))
    inputs = {}
    data = "/opt/ml/processing/input/data"
    for root, _, files in os.walk(data):
        for name in files:
            inputs[os.path.relpath(os.path.join(root, name), data)] = read(os.path.join(root, name))
    peers = {}
    for other in resource["hosts"]:
        try:
            peers[other] = socket.gethostbyname(other)
        except OSError as e:
            peers[other] = "error: %s" % e
    report = {
        "host": host,
        "hostname": socket.gethostname(),
        "argv": sys.argv,
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "env": {k: ("<set>" if k in SECRETS else v) for k, v in os.environ.items()},
        "processingjobconfig_text": read("/opt/ml/config/processingjobconfig.json"),
        "resourceconfig_text": resource_text,
        "tree": sorted(tree),
        "inputs": inputs,
        "peers": peers,
    }
    out = "/opt/ml/processing/output/layout"
    with open(os.path.join(out, host + ".json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    print("layout_probe: %s reported %d paths" % (host, len(tree)), flush=True)


if __name__ == "__main__":
    main()
