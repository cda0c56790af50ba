"""The SageMaker Python SDK (2.257.6) as a test client: where it is, how a scenario process imports
it, and how the pytest side runs scenarios (test_sdk.py).

Why a process per scenario: the SDK needs botocore/boto3 1.43, which it finds first on sys.path in
`<repo>/../shared/clients/sagemaker-python-sdk/lib` (override: $KILN_SAGEMAKER_SDK_LIB). The rest
of the suite runs on Debian's boto3 1.26 in the pytest process, and a module imported once cannot
be swapped back, so importing the SDK there would silently change the client under every later
test file. Each scenario (sdk/scenarios.py) therefore runs as `/usr/bin/python3 sdk/scenarios.py
NAME RESULT.json ARGS.json` with the SDK's lib first on its path; the pytest process only starts
those processes, reads their JSON results and checks the server with its own boto3 1.26. Scenarios
that do not depend on each other run concurrently (the SDK mostly sleeps: 5 s before fit()'s first
Describe, 10 s log polls, 30 s between deploy()'s DescribeEndpoint polls), so the suite's wall time
is about that of its longest chain, not the sum.

Two halves:
  * pytest side: sdk_lib_dir(), ScenarioRunner (no SDK import).
  * scenario side: import_sdk(), session() — only called inside scenario processes.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SDK_DIR = os.path.join(HERE, "sdk")
SCENARIOS = os.path.join(SDK_DIR, "scenarios.py")
JOBS_DIR = os.path.join(HERE, "jobs")

ROLE_ARN = "arn:aws:iam::000000000000:role/KilnSdkTest"
# The bundle is pure Python for Debian's interpreter (its numpy, pandas, scikit-learn, torch).
SDK_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
REGION = "us-east-1"


def sdk_lib_dir():
    """The bundle's lib/ (sagemaker, boto3 1.43, ...): $KILN_SAGEMAKER_SDK_LIB, else the `shared`
    sibling of the repository (CI's layout; /work/shared here). None when absent."""
    path = os.environ.get("KILN_SAGEMAKER_SDK_LIB") or os.path.join(
        REPO_ROOT, "..", "shared", "clients", "sagemaker-python-sdk", "lib")
    path = os.path.abspath(path)
    return path if os.path.isdir(os.path.join(path, "sagemaker")) else None


# ---------------------------------------------------------------------------------------------
# pytest side


class ScenarioFailed(AssertionError):
    pass


class Scenario:
    """One running scenario process; result() waits for it."""

    def __init__(self, name, proc, result_path, out_path, started, timeout):
        self.name = name
        self.proc = proc
        self.result_path = result_path
        self.out_path = out_path
        self.started = started
        self.timeout = timeout
        self.wall = None
        self._result = None

    def output(self):
        try:
            with open(self.out_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def seconds(self):
        """How long the scenario process ran (SDK import included), once its result was read."""
        return (self._result or {}).get("scenario_seconds")

    def wait(self):
        if self.wall is not None:
            return self.proc.returncode
        left = max(1.0, self.started + self.timeout - time.monotonic())
        try:
            self.proc.wait(left)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.wall = time.monotonic() - self.started
        return self.proc.returncode

    def result(self, server=None):
        """The scenario's JSON result (its `output` member holds everything it printed, e.g. the
        logs fit() streamed). Raises ScenarioFailed with the output tail (and the server's log
        tail) when the process failed or timed out."""
        rc = self.wait()
        if rc != 0 or not os.path.exists(self.result_path):
            reason = ("timed out after %ss" % self.timeout) if rc in (-9, 137) else ("exited %s" % rc)
            tail = "\n".join(self.output().splitlines()[-80:])
            raise ScenarioFailed("SDK scenario %s %s; its output (tail):\n%s%s" % (
                self.name, reason, tail,
                ("\n--- server log tail (requests left out):\n" + server_events(server)) if server else ""))
        if self._result is None:
            with open(self.result_path) as f:
                self._result = json.load(f)
            self._result["output"] = self.output()
        return self._result


def server_events(server, n=30):
    """The last `n` lines of the server's log that are not access-log lines (the SDK's polling
    would fill any tail with DescribeTrainingJob / DescribeLogStreams requests)."""
    lines = [line for line in server.log_text().splitlines() if 'msg="request"' not in line]
    return "\n".join(lines[-n:])


class ScenarioRunner:
    """Starts scenario processes against one server; each scenario runs at most once per runner
    (start() of a running or finished one returns it)."""

    script = SCENARIOS  # the scenarios file a subclass may replace

    def __init__(self, server, workdir, lib_dir):
        self.server = server
        self.workdir = workdir
        self.lib_dir = lib_dir
        self.scenarios = {}
        os.makedirs(workdir, exist_ok=True)
        self.home = os.path.join(workdir, "home")
        os.makedirs(self.home, exist_ok=True)

    def env(self):
        """Only the server's credentials and endpoint: no user AWS/SageMaker config, no IMDS."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEMAKER_", "PYTHON"))}
        env.update({
            "PYTHONPATH": self.lib_dir,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "HOME": self.home,
            "AWS_ENDPOINT_URL": self.server.endpoint,
            "AWS_ACCESS_KEY_ID": self.server.access_key,
            "AWS_SECRET_ACCESS_KEY": self.server.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": os.path.join(self.home, "aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self.home, "aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
        })
        return env

    def start(self, name, args, timeout=300):
        """Starts scenario `name` with `args` (a JSON-able dict, must hold "bucket")."""
        if name in self.scenarios:
            return self.scenarios[name]
        base = os.path.join(self.workdir, name)
        args_path, result_path, out_path = base + ".args.json", base + ".result.json", base + ".out"
        with open(args_path, "w") as f:
            json.dump(args, f)
        out = open(out_path, "wb")
        try:
            proc = subprocess.Popen([SDK_PYTHON, self.script, name, result_path, args_path],
                                    cwd=self.workdir, env=self.env(), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()
        sc = Scenario(name, proc, result_path, out_path, time.monotonic(), timeout)
        self.scenarios[name] = sc
        return sc

    def result(self, name):
        return self.scenarios[name].result(self.server)

    def stop_all(self):
        for sc in self.scenarios.values():
            if sc.proc.poll() is None:
                sc.proc.kill()
            sc.wait()


# ---------------------------------------------------------------------------------------------
# Scenario side (inside a scenario process only)


def import_sdk():
    """Puts the bundle's lib/ first on sys.path and imports the SDK; checks that its boto3 is the
    one that won (the SDK with Debian's boto3 1.26 fails in confusing ways)."""
    lib = sdk_lib_dir()
    if lib is None:
        raise RuntimeError("SageMaker Python SDK bundle not found (set KILN_SAGEMAKER_SDK_LIB)")
    if sys.path[:1] != [lib]:
        sys.path.insert(0, lib)
    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    import boto3
    import sagemaker
    if not os.path.abspath(boto3.__file__).startswith(lib):
        raise RuntimeError("boto3 came from %s, not from the SDK bundle %s" % (boto3.__file__, lib))
    return sagemaker


def session(bucket):
    """A sagemaker.Session the way the bundle's README shows: clients from AWS_ENDPOINT_URL (read
    by botocore 1.43), an explicit default bucket (else the SDK asks AWS's own STS for the
    account), telemetry off (else it calls AWS)."""
    sagemaker = import_sdk()
    import boto3
    boto_sess = boto3.Session(region_name=os.environ.get("AWS_DEFAULT_REGION", REGION))
    return sagemaker.Session(
        boto_session=boto_sess,
        sagemaker_client=boto_sess.client("sagemaker"),
        sagemaker_runtime_client=boto_sess.client("sagemaker-runtime"),
        default_bucket=bucket,
        sagemaker_config={"SchemaVersion": "1.0",
                          "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}})
