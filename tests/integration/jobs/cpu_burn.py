#!/usr/bin/python3
"""A `local:` training program for the instance-metrics test: holds `memory_mib` MiB (default 64)
and keeps one core busy for `seconds` (default 15) in a tight loop, printing a line every second.
Hyperparameters come from /opt/ml/input/config/hyperparameters.json (string values)."""
import json
import time

with open("/opt/ml/input/config/hyperparameters.json") as f:
    hps = json.load(f)
seconds = float(hps.get("seconds", "15"))
held = bytearray(int(hps.get("memory_mib", "64")) * 1024 * 1024)
for i in range(0, len(held), 4096):
    held[i] = 1  # touch every page so that it is resident
start = time.monotonic()
next_print = start
n = 0
while True:
    now = time.monotonic()
    if now - start >= seconds:
        break
    if now >= next_print:
        print("burning %.0f s" % (now - start), flush=True)
        next_print += 1
    n += 1
print("done after %d iterations" % n, flush=True)
