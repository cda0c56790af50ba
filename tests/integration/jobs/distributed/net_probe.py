#!/usr/bin/python3
"""A `local:` image for the multi-host network tests (test_instance_networks.py,
test_distributed_training.py): Kiln runs `<this file> train` on every host of the job. Driven by
hyperparameters.json (string values); every step prints one line (the tests read the per-host log
streams) and what the host saw goes to /opt/ml/model/<host>-net.json (merged into model.tar.gz).
Steps, in this order, each only when its key is set:

  (always)              NETINFO {json}: host, hostname, eth0 address/netmask/subnet gateway,
                        interfaces, default route, what every algo-N in resourceconfig resolves to
  channel=NAME          SHARD {json}: the files of File-mode channel NAME, {relative path: sha256}
  listen_port=P         a TCP listener on 0.0.0.0:P (prints "LISTENING <eth0 address>:P", then
                        "ACCEPTED <peer address>" per connection) for the rest of the program
  peer_port=P           connect to every other host of the job at algo-N:P, retrying for up to 60 s
                        ("PEER algo-N ok|fail ...")
  connect=A:P,B:P       one connection attempt each: "CONNECT A:P ok|fail ..."
  connect_gateway_port=P  the same to <subnet gateway>:P ("CONNECT gateway <addr>:P ...")
  connect_loopback_port=P the same to 127.0.0.1:P ("CONNECT loopback 127.0.0.1:P ...")
  s3_put=s3://b/k       PUT the host name there with boto3 through AWS_ENDPOINT_URL ("S3PUT ok")
  fail_host=H, fail_after=S   on host H only: sleep S seconds, then exit 1 ("failing on purpose")
  sleep=S               sleep S seconds (hosts that do not fail)
"""
import hashlib
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netinfo  # noqa: E402

ML = "/opt/ml"


def read_json(path):
    with open(path) as f:
        return json.load(f)


def say(*parts):
    print(" ".join(str(p) for p in parts), flush=True)


hps = read_json(os.path.join(ML, "input/config/hyperparameters.json"))
rc = read_json(os.path.join(ML, "input/config/resourceconfig.json"))
host = rc["current_host"]
iface = rc.get("network_interface_name", "eth0")
eth = netinfo.interface(iface)
info = {"host": host, "hostname": socket.gethostname(), "interface_name": iface, "interface": eth,
        "interfaces": netinfo.interfaces(), "default_route": netinfo.default_route(),
        "resolves": {h: netinfo.resolve(h) for h in rc["hosts"]}, "pid": os.getpid()}
say("NETINFO", json.dumps(info, sort_keys=True))
report = {"netinfo": info}


def save():
    with open(os.path.join(ML, "model", "%s-net.json" % host), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)


save()

if "channel" in hps:
    root = os.path.join(ML, "input/data", hps["channel"])
    files = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                files[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
    report["shard"] = files
    say("SHARD", json.dumps({"host": host, "files": files}, sort_keys=True))
    save()

if "listen_port" in hps:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(hps["listen_port"])))
    srv.listen(16)

    def serve():
        while True:
            conn, peer = srv.accept()
            say("ACCEPTED", peer[0])
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    say("LISTENING", "%s:%s" % ((eth or {}).get("address"), hps["listen_port"]))

results = {}
if "peer_port" in hps:
    for other in rc["hosts"]:
        if other == host:
            continue
        deadline = time.monotonic() + 60
        while True:
            r = netinfo.try_connect(other, hps["peer_port"], timeout=2)
            if r == "ok" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        results["peer " + other] = r
        say("PEER", other, r)

targets = [t for t in hps.get("connect", "").split(",") if t]
for t in targets:
    a, _, p = t.rpartition(":")
    results[t] = netinfo.try_connect(a, p)
    say("CONNECT", t, results[t])
if "connect_gateway_port" in hps and eth:
    t = "%s:%s" % (eth["gateway"], hps["connect_gateway_port"])
    results["gateway"] = netinfo.try_connect(eth["gateway"], hps["connect_gateway_port"])
    say("CONNECT gateway", t, results["gateway"])
if "connect_loopback_port" in hps:
    results["loopback"] = netinfo.try_connect("127.0.0.1", hps["connect_loopback_port"])
    say("CONNECT loopback", "127.0.0.1:%s" % hps["connect_loopback_port"], results["loopback"])
report["connect"] = results
save()

if "s3_put" in hps:
    import boto3
    bucket, _, key = hps["s3_put"][5:].partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ.get("AWS_REGION"))
    s3.put_object(Bucket=bucket, Key=key, Body=host.encode())
    say("S3PUT ok", os.environ["AWS_ENDPOINT_URL"])

if hps.get("fail_host") == host:
    time.sleep(float(hps.get("fail_after", "0")))
    sys.stderr.write("host %s failing on purpose\n" % host)
    sys.exit(1)
if "sleep" in hps:
    time.sleep(float(hps["sleep"]))
say("DONE", host)
