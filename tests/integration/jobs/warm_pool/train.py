"""Training script of test_warm_pools.py: what a warm pool keeps, as the job sees it.

Prints the persistent cache's previous content (SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY, kept
by the pool this job took) and the channel's files, then leaves its own mark in the cache and a
model. Standard library only."""

import hashlib
import json
import os

cache = os.environ.get("SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY", "")
job = json.loads(os.environ.get("SM_TRAINING_ENV", "{}")).get("job_name", "?")
print("warm_pool: cache directory %s" % (cache or "(none)"), flush=True)
if cache:
    marker = os.path.join(cache, "left-by.txt")
    if os.path.exists(marker):
        with open(marker) as f:
            print("warm_pool: cache kept from %s" % f.read().strip(), flush=True)
    else:
        print("warm_pool: cache empty", flush=True)
    with open(marker, "w") as f:
        f.write(job)

channel = os.environ.get("SM_CHANNEL_TRAIN", "")
digest = hashlib.sha256()
count = 0
for root, _, files in sorted(os.walk(channel)) if channel else []:
    for name in sorted(files):
        with open(os.path.join(root, name), "rb") as f:
            digest.update(f.read())
        count += 1
print("warm_pool: channel files=%d sha256=%s" % (count, digest.hexdigest()), flush=True)
with open(os.path.join(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"), "model.txt"), "w") as f:
    f.write(job)
