"""FrameworkProcessor (PyTorchProcessor) entry point in test_processing.py: run by the SDK's
runproc.sh as `python process.py ARGS...` from /opt/ml/processing/input/code/ after it unpacked
sourcedir.tar.gz there; imports a module of its source_dir and reports to its output."""

import json
import os
import sys

import helper  # noqa: E402 (in the source_dir beside this file)

out = "/opt/ml/processing/output/framework"
with open(os.path.join(out, "report.json"), "w") as f:
    json.dump({"argv": sys.argv, "cwd": os.getcwd(), "executable": sys.executable, "helper": helper.VALUE,
               "path": os.environ.get("PATH", "")}, f)
print("framework process: %s" % helper.VALUE, flush=True)
