#!/usr/bin/python3
"""A bring-your-own-container style training program for the integration tests.

Kiln runs it as `<this file> train` (image `local:<this file>`). What it does is driven by
/opt/ml/input/config/hyperparameters.json (plain string values); everything it observes goes to
/opt/ml/model/report.json, which Kiln uploads in model.tar.gz, so the tests can check what the
container saw. Steps run in this order (each only when its key is set):

  sigterm=1             install a SIGTERM handler: print "caught SIGTERM", write model/sigterm.txt,
                        exit with sigterm_exit (default 0)
  write_model=TEXT      model/partial.txt
  write_output=TEXT     output/data/out.txt
  checkpoint=TEXT       record the files found in the checkpoint dir (checkpoint_dir, default
                        /opt/ml/checkpoints), then write ckpt-new.txt with TEXT into it
  copy_channels=1       record {relative path: sha256} of every File-mode channel directory
  pipe_epochs=N         for every Pipe channel c read c_0 .. c_{N-1} fully; record sha256 + size
  s3_put=s3://b/k       PUT the job name at that URI with boto3 using AWS_ENDPOINT_URL (+ creds)
  lines=N               print "line i" for i < N
  ticks=N               print "tick i" every tick_interval seconds (default 1)
  sleep=S               sleep S seconds
  failure=TEXT          write output/failure
  stderr=TEXT           write TEXT as the last stderr line
  exit_code=N           exit status (default 0)
"""
import hashlib
import json
import os
import signal
import sys
import time

ML = "/opt/ml"
MODEL = os.path.join(ML, "model")
report = {}


def save_report():
    tmp = os.path.join(MODEL, ".report.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(MODEL, "report.json"))


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"__error__": repr(e)}


def tree(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for fn in files:
            p = os.path.join(dirpath, fn)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def on_sigterm(signum, frame):
    print("caught SIGTERM", flush=True)
    with open(os.path.join(MODEL, "sigterm.txt"), "w") as f:
        f.write("terminated gracefully\n")
    report["sigterm"] = True
    save_report()
    sys.exit(int(hps.get("sigterm_exit", "0")))


hps = read_json(os.path.join(ML, "input/config/hyperparameters.json"))
channels = read_json(os.path.join(ML, "input/config/inputdataconfig.json"))
if hps.get("sigterm") == "1":
    signal.signal(signal.SIGTERM, on_sigterm)

report["argv"] = sys.argv
report["env"] = {k: ("<set>" if ("SECRET" in k or "TOKEN" in k) else v) for k, v in os.environ.items()}
report["hyperparameters"] = hps
report["inputdataconfig"] = channels
report["resourceconfig"] = read_json(os.path.join(ML, "input/config/resourceconfig.json"))
save_report()

if "write_model" in hps:
    with open(os.path.join(MODEL, "partial.txt"), "w") as f:
        f.write(hps["write_model"])
if "write_output" in hps:
    os.makedirs(os.path.join(ML, "output/data"), exist_ok=True)
    with open(os.path.join(ML, "output/data/out.txt"), "w") as f:
        f.write(hps["write_output"])

if "checkpoint" in hps:
    ckdir = hps.get("checkpoint_dir", os.path.join(ML, "checkpoints"))
    report["checkpoints_seen"] = tree(ckdir) if os.path.isdir(ckdir) else None
    os.makedirs(ckdir, exist_ok=True)
    with open(os.path.join(ckdir, "ckpt-new.txt"), "w") as f:
        f.write(hps["checkpoint"])
    save_report()

if hps.get("copy_channels") == "1":
    report["channels"] = {}
    for name, cfg in sorted(channels.items()):
        d = os.path.join(ML, "input/data", name)
        if cfg.get("TrainingInputMode") != "Pipe" and os.path.isdir(d):
            report["channels"][name] = tree(d)
    save_report()

if "pipe_epochs" in hps:
    report["pipes"] = {}
    for name, cfg in sorted(channels.items()):
        if cfg.get("TrainingInputMode") != "Pipe":
            continue
        epochs = []
        for k in range(int(hps["pipe_epochs"])):
            path = os.path.join(ML, "input/data", "%s_%d" % (name, k))
            deadline = time.time() + 60
            while not os.path.exists(path):  # the next epoch's FIFO may appear after a delay
                if time.time() > deadline:
                    raise SystemExit("no FIFO %s after 60 s" % path)
                time.sleep(0.05)
            h, n = hashlib.sha256(), 0
            with open(path, "rb") as f:
                while True:
                    b = f.read(65536)
                    if not b:
                        break
                    h.update(b)
                    n += len(b)
            epochs.append({"sha256": h.hexdigest(), "size": n})
        report["pipes"][name] = epochs
    save_report()

if "s3_put" in hps:
    import boto3
    bucket, _, key = hps["s3_put"][5:].partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ.get("AWS_REGION"))
    s3.put_object(Bucket=bucket, Key=key, Body=os.environ["TRAINING_JOB_NAME"].encode())

for i in range(int(hps.get("lines", "0"))):
    print("line %d" % i, flush=True)

for i in range(int(hps.get("ticks", "0"))):
    print("tick %d" % i, flush=True)
    time.sleep(float(hps.get("tick_interval", "1")))

if "sleep" in hps:
    time.sleep(float(hps["sleep"]))

if "failure" in hps:
    with open(os.path.join(ML, "output/failure"), "w") as f:
        f.write(hps["failure"])
if "stderr" in hps:
    sys.stderr.write(hps["stderr"] + "\n")
    sys.stderr.flush()
report["finished"] = True
save_report()
sys.exit(int(hps.get("exit_code", "0")))
