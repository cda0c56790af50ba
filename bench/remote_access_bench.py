#!/usr/bin/python3
"""Remote access (issue 16): how long `kiln connect` takes to a prompt, the round trip of one
keystroke in an interactive session, and `scp` of a large file out of a running training job,
each next to the same client against a plain OpenSSH `sshd` on this machine (the reference).

  /usr/bin/python3 bench/remote_access_bench.py [--runs 10] [--keystrokes 200] [--size-mib 1024]
                                                [--sshd /usr/sbin/sshd] [--dir /path/on/disk]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln; network mode auto on 10.250.0.0/16)
with a temp data dir under --dir and one script-mode training job with RemoteDebugConfig enabled
that sleeps until stopped. HOME is a temp dir (the client key ~/.ssh/sagemaker-ssh-gw is created
there on first use). Rows:

  connect -- true     wall time of `kiln connect <target> -- true` (key exchange, auth, one exec:
                      the whole path: CLI → ssh → ssh-proxy → SigV4 upgrade → daemon → agent)
                      against `ssh -p <port> root@127.0.0.1 true` to the local sshd
  first prompt        `kiln connect <target>` under pexpect until the shell's prompt, against
                      `ssh -tt` to the local sshd until its prompt
  keystroke           one character sent, until its echo comes back (pexpect, the remote PTY
                      echoes it), --keystrokes times; p50 and p99
  scp out             `scp` of --size-mib MiB of random bytes from the instance's /tmp to --dir
                      through `kiln ssh-config`'s block, against `scp` of the same size from the
                      local sshd; checked by SHA-256 (untimed)

The reference needs OpenSSH's server: Debian's openssh-server (not installed by
scripts/install-deps.sh: its package starts a system-wide sshd). Without it (`--sshd` not
executable) the reference rows print "skipped". The sshd is started by the bench on a free loopback
port with a config of its own (host key, authorized_keys = the client key, no PAM) and stopped at
the end; `/run/sshd` (its privilege-separation directory) is created when missing.
Root only (remote access enters the instance's namespaces). Prints one table.
"""

import argparse
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import kiln_harness as kh  # noqa: E402

PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.1.0-cpu-py310"
ROLE = "arn:aws:iam::000000000000:role/bench"
TRAIN_PY = r'''import signal, threading
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print("BENCH-TARGET ready", flush=True)
stop.wait()
'''
PROMPT = "BENCHPROMPT> "


def make_tar_gz(files):
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stats(xs):
    xs = sorted(xs)
    return {"best": xs[0], "p50": statistics.median(xs), "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))]}


class Side:
    """One way of reaching a shell: argv prefixes for ssh-like commands."""

    def __init__(self, name, ssh_args, scp_args, host, interactive):
        self.name = name
        self.ssh_args = ssh_args      # ssh ... <host> (command appended)
        self.scp_args = scp_args      # scp options (source/destination appended)
        self.host = host
        self.interactive = interactive  # argv of an interactive session


def run(cmd, env, timeout=600, check=True):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise RuntimeError("%s exited %d\nstdout:\n%s\nstderr:\n%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p


def time_true(side, env, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run(side.ssh_args + [side.host, "true"], env)
        times.append(time.perf_counter() - start)
    return times


def interactive(side, env, runs, keystrokes):
    """(seconds to the first prompt per run, keystroke echo round trips of the last run)."""
    import pexpect
    prompts, rtts = [], []
    for i in range(runs):
        start = time.perf_counter()
        child = pexpect.spawn(side.interactive[0], side.interactive[1:], env=env, encoding="utf-8", timeout=60,
                              dimensions=(24, 120))
        child.delaybeforesend = None  # pexpect sleeps 50 ms before every send by default
        child.expect(r"[#$] ")
        prompts.append(time.perf_counter() - start)
        if i == runs - 1:
            child.sendline("PS1='BENCH''PROMPT> '")
            child.expect(PROMPT)
            for k in range(keystrokes):
                ch = "abcdefghijklmnopqrstuvwxyz"[k % 26]
                t0 = time.perf_counter()
                child.send(ch)
                child.expect_exact(ch)
                rtts.append(time.perf_counter() - t0)
                if k % 26 == 25:
                    child.sendcontrol("u")  # clear the line now and then
            child.sendcontrol("u")
        child.sendline("exit")
        child.expect(pexpect.EOF)
        child.close()
    return prompts, rtts


def scp_out(side, env, remote_path, dest, runs):
    times = []
    for _ in range(runs):
        if os.path.exists(dest):
            os.unlink(dest)
        start = time.perf_counter()
        run(side.scp_args + ["%s:%s" % (side.host, remote_path), dest], env)
        times.append(time.perf_counter() - start)
    return times


def start_sshd(sshd, workdir, public_key):
    """A private sshd on a free loopback port accepting `public_key` for root; (proc, port)."""
    os.makedirs("/run/sshd", exist_ok=True)
    host_key = os.path.join(workdir, "sshd_host_ed25519")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key], check=True)
    keys = os.path.join(workdir, "authorized_keys")
    with open(keys, "w") as f:
        f.write(public_key + "\n")
    os.chmod(keys, 0o600)
    port = kh.free_port()
    sftp = next((p for p in ("/usr/lib/openssh/sftp-server", os.path.join(os.path.dirname(sshd), "..", "lib",
                                                                          "openssh", "sftp-server"))
                 if os.path.exists(p)), "internal-sftp")
    config = os.path.join(workdir, "sshd_config")
    with open(config, "w") as f:
        f.write("\n".join([
            "Port %d" % port, "ListenAddress 127.0.0.1", "HostKey " + host_key, "AuthorizedKeysFile " + keys,
            "PidFile " + os.path.join(workdir, "sshd.pid"), "StrictModes no", "UsePAM no",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "Subsystem sftp " + os.path.abspath(sftp), ""]))
    log = open(os.path.join(workdir, "sshd.log"), "wb")
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", config], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    import socket
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sshd did not start; see %s" % os.path.join(workdir, "sshd.log"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--scp-runs", type=int, default=3)
    ap.add_argument("--keystrokes", type=int, default=200)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--sshd", default="/usr/sbin/sshd")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("remote access enters an instance's namespaces: run as root")

    work = tempfile.mkdtemp(prefix="kiln-remote-bench-", dir=args.dir)
    home = os.path.join(work, "home")
    os.makedirs(home)
    server = kh.KilnServer(os.path.join(work, "data"), log_level="info", config={
        "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
        "network": {"mode": "auto", "cidr": "10.250.0.0/16"}})
    server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"HOME": home, "AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": server.endpoint})
    sshd = None
    job = "remote-bench-%d" % int(time.time())
    sm = server.client("sagemaker")
    try:
        s3 = server.client("s3")
        s3.create_bucket(Bucket="remote-bench")
        s3.put_object(Bucket="remote-bench", Key="code/sourcedir.tar.gz", Body=make_tar_gz({"train.py": TRAIN_PY}))
        req = {"TrainingJobName": job, "RoleArn": ROLE,
               "AlgorithmSpecification": {"TrainingImage": PYTORCH_IMAGE, "TrainingInputMode": "File"},
               "HyperParameters": {"sagemaker_program": '"train.py"',
                                   "sagemaker_submit_directory": '"s3://remote-bench/code/sourcedir.tar.gz"'},
               "OutputDataConfig": {"S3OutputPath": "s3://remote-bench/output"},
               "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 5},
               "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
               "RemoteDebugConfig": {"EnableRemoteDebug": True}}
        status, _, body = kh.json_request(server, "SageMaker.CreateTrainingJob", req)
        if status != 200:
            raise RuntimeError("CreateTrainingJob: %s" % body)
        target = "training-job/%s/algo-1" % job
        kiln = kh.kiln_bin()
        deadline = time.monotonic() + 120
        while run([kiln, "connect", "--endpoint-url", server.endpoint, target, "--", "true"], env,
                  check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the job never became reachable; server log:\n" + server.log_tail())
            time.sleep(0.5)

        alias = "bench-" + job
        cfg = os.path.join(work, "ssh_config")
        with open(cfg, "w") as f:
            f.write(run([kiln, "ssh-config", "--endpoint-url", server.endpoint, target, "--alias", alias], env).stdout)
        sides = [Side("kiln", [kiln, "connect", "--endpoint-url", server.endpoint], ["scp", "-F", cfg], None,
                      [kiln, "connect", "--endpoint-url", server.endpoint, target])]
        key = os.path.join(home, ".ssh", "sagemaker-ssh-gw")
        if os.access(args.sshd, os.X_OK):
            with open(key + ".pub") as f:
                sshd, port = start_sshd(args.sshd, work, f.read().strip())
            common = ["-p", str(port), "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                      "-o", "UserKnownHostsFile=" + os.path.join(work, "known_hosts"),
                      "-o", "StrictHostKeyChecking=accept-new"]
            scp_common = ["-P" if c == "-p" else c for c in common]
            sides.append(Side("local sshd", ["ssh"] + common, ["scp"] + scp_common, "root@127.0.0.1",
                              ["ssh", "-tt"] + common + ["root@127.0.0.1"]))
        else:
            print("reference skipped: %s is not installed (Debian openssh-server)" % args.sshd)

        rows = []
        # connect -- true
        for side in sides:
            if side.name == "kiln":
                t = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    run([kiln, "connect", "--endpoint-url", server.endpoint, target, "--", "true"], env)
                    t.append(time.perf_counter() - start)
            else:
                t = time_true(side, env, args.runs)
            rows.append(("connect -- true", side.name, stats(t), "s"))
        for side in sides:
            prompts, rtts = interactive(side, env, max(1, args.runs // 2), args.keystrokes)
            rows.append(("first prompt", side.name, stats(prompts), "s"))
            rows.append(("keystroke", side.name, stats(rtts), "s"))

        # scp out: the same random bytes in the instance's /tmp and (for the reference) on the host.
        size = args.size_mib * 1024 * 1024
        remote_path = "/tmp/kiln-remote-bench-%d.bin" % os.getpid()
        local_src = os.path.join(work, "src.bin")
        with open(local_src, "wb") as f:
            left = size
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
        digest = sha256_file(local_src)
        run(["scp", "-F", cfg, local_src, "%s:%s" % (alias, remote_path)], env)
        dest = os.path.join(work, "dest.bin")
        for side in sides:
            src = remote_path if side.name == "kiln" else local_src
            host = alias if side.name == "kiln" else side.host
            side_scp = Side(side.name, None, side.scp_args, host, None)
            t = scp_out(side_scp, env, src, dest, args.scp_runs)
            if sha256_file(dest) != digest:
                raise RuntimeError("scp from %s: SHA-256 differs" % side.name)
            rows.append(("scp out %d MiB" % args.size_mib, side.name, stats(t), "s"))
            rows.append(("  = MB/s (best)", side.name, {"best": size / 1e6 / min(t), "p50": size / 1e6 /
                                                         statistics.median(t), "p99": float("nan")}, "MB/s"))
        run([kiln, "connect", "--endpoint-url", server.endpoint, target, "--", "rm", "-f", remote_path], env)

        print("\nremote access, %d CPUs, %d runs (%d keystrokes, scp %d runs)" % (
            os.cpu_count(), args.runs, args.keystrokes, args.scp_runs))
        print("%-20s %-11s %10s %10s %10s" % ("row", "side", "best", "p50", "p99"))
        for what, side, s, unit in rows:
            if unit == "s":
                cells = ["%8.1f ms" % (s[k] * 1e3) for k in ("best", "p50", "p99")]
            else:
                cells = ["%10.0f" % s["best"], "%10.0f" % s["p50"], "%10s" % "-"]
            print("%-20s %-11s %s" % (what, side, " ".join(cells)))
    finally:
        if sshd is not None:
            sshd.send_signal(signal.SIGTERM)
            sshd.wait(10)
        try:
            sm.stop_training_job(TrainingJobName=job)
            deadline = time.monotonic() + 60
            while sm.describe_training_job(TrainingJobName=job)["TrainingJobStatus"] not in (
                    "Completed", "Failed", "Stopped") and time.monotonic() < deadline:
                time.sleep(0.5)
        except Exception as e:  # the job may never have been created
            print("stopping the job: %r" % e)
        server.stop(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
