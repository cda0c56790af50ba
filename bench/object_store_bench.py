#!/usr/bin/python3
"""Object-store throughput benchmark: how fast does a 1 GiB file move through Kiln's S3 front and
fs backend, compared with copying it on the same disk, and how much memory does the server use?

  /usr/bin/python3 bench/object_store_bench.py [--size-mib 1024] [--dir /path/on/disk]
                                               [--threads 8] [--part-mib 64] [--runs 1]

Starts `kiln server` ($KILN_BIN, default build/src/cli/kiln) with a temp data dir under --dir,
creates a random file there, then times:
  cp            cp FILE COPY (page cache; what the disk/kernel do with no protocol)
  cp+fsync      the same followed by fsync of the copy (Kiln fsyncs before acknowledging)
  boto3 up/down upload_file / download_file, TransferConfig(part size, threads)
  aws up/down   `aws s3 cp` (Debian's /usr/bin/aws v2, default 8 MiB parts, 10 threads)
Every download is verified by SHA-256 (not timed). The server's peak RSS (VmHWM) is reset before
each phase through /proc/<pid>/clear_refs and read after it, and VmRSS is also sampled every 50 ms.
Prints a table with MB/s (10^6 bytes/s), the ratio to cp, and peak server RSS.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import kiln_harness as kh  # noqa: E402


def read_status_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class RssWatch:
    """Peak RSS of one process over a phase: VmHWM (reset at start where allowed) and sampled VmRSS."""

    def __init__(self, pid):
        self.pid = pid
        self.peak_sample = 0
        self._stop = threading.Event()
        self._thread = None
        self.hwm_reset = False

    def __enter__(self):
        try:
            with open("/proc/%d/clear_refs" % self.pid, "w") as f:
                f.write("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak_sample = max(self.peak_sample, read_status_kib(self.pid, "VmRSS"))
            except OSError:
                return
            time.sleep(0.05)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.hwm = read_status_kib(self.pid, "VmHWM")
        self.peak_kib = max(self.hwm, self.peak_sample) if self.hwm_reset else self.peak_sample
        return False


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def drop_file(path):
    if os.path.exists(path):
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--dir", default=os.environ.get("KILN_BENCH_DIR", tempfile.gettempdir()),
                    help="where the file, the copies and the server's data dir go (one disk)")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--part-mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=1, help="repeat each timing and keep the best")
    ap.add_argument("--no-cli", action="store_true", help="skip the aws s3 cp rows")
    args = ap.parse_args()

    import boto3  # noqa: F401  (fail early with a clear error)
    from boto3.s3.transfer import TransferConfig

    work = tempfile.mkdtemp(prefix="kiln-bench-", dir=args.dir)
    size = args.size_mib * 1024 * 1024
    src = os.path.join(work, "src.bin")
    out = os.path.join(work, "out.bin")
    server = None
    rows = []
    try:
        print("creating %d MiB file in %s ..." % (args.size_mib, work), flush=True)
        digest = kh.make_random_file(src, size)
        server = kh.KilnServer(os.path.join(work, "data"), log_level="info")
        server.start()
        pid = server.proc.pid
        s3 = server.client("s3", retries=3)
        s3.create_bucket(Bucket="bench")
        idle_rss = read_status_kib(pid, "VmRSS")

        def best(name, fn, before=None, verify=None, watch=True):
            times, peaks = [], []
            for _ in range(args.runs):
                if before:
                    before()
                if watch:
                    with RssWatch(pid) as w:
                        times.append(timed(fn))
                    peaks.append(w.peak_kib)
                else:
                    times.append(timed(fn))
                if verify:
                    verify()
            rows.append((name, min(times), max(peaks) if peaks else None))
            print("  %-26s %7.2f s" % (name, min(times)), flush=True)

        def cp():
            subprocess.run(["cp", src, out], check=True)

        def cp_fsync():
            subprocess.run(["cp", src, out], check=True)
            fd = os.open(out, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

        def verify_out():
            assert kh.sha256_file(out) == digest, "downloaded bytes differ"
            drop_file(out)

        best("cp", cp, before=lambda: drop_file(out), verify=lambda: drop_file(out), watch=False)
        best("cp+fsync", cp_fsync, before=lambda: drop_file(out), verify=lambda: drop_file(out), watch=False)

        cfg = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=args.part_mib * 1024 * 1024,
                             max_concurrency=args.threads, use_threads=True)
        label = "%d MiB x %d thr" % (args.part_mib, args.threads)
        best("boto3 upload (%s)" % label, lambda: s3.upload_file(src, "bench", "boto3.bin", Config=cfg))
        best("boto3 download (%s)" % label, lambda: s3.download_file("bench", "boto3.bin", out, Config=cfg),
             before=lambda: drop_file(out), verify=verify_out)
        s3.delete_object(Bucket="bench", Key="boto3.bin")

        cli = kh.aws_cli()
        if cli and not args.no_cli:
            home = os.path.join(work, "awshome")
            os.makedirs(home, exist_ok=True)
            env = server.aws_env(home)
            base = [cli, "--endpoint-url", server.endpoint, "--no-cli-pager", "s3", "cp", "--only-show-errors"]
            best("aws s3 cp upload", lambda: subprocess.run(base + [src, "s3://bench/cli.bin"], env=env, check=True))
            best("aws s3 cp download", lambda: subprocess.run(base + ["s3://bench/cli.bin", out], env=env, check=True),
                 before=lambda: drop_file(out), verify=verify_out)
            s3.delete_object(Bucket="bench", Key="cli.bin")

        rc = server.stop()
        server = None
        cp_time = rows[0][1]
        mb = size / 1e6
        print()
        print("Kiln object store, %d MiB file, data dir on %s, %d CPUs" % (args.size_mib, args.dir, os.cpu_count()))
        print("server idle RSS %.1f MiB; clean shutdown exit %s" % (idle_rss / 1024, rc))
        print()
        print("| %-32s | %8s | %9s | %10s | %15s |" % ("operation", "seconds", "MB/s", "cp time / t", "peak RSS (MiB)"))
        print("|%s|%s|%s|%s|%s|" % ("-" * 34, "-" * 10, "-" * 11, "-" * 12, "-" * 17))
        for name, t, peak in rows:
            print("| %-32s | %8.2f | %9.1f | %10.2f | %15s |" % (
                name, t, mb / t, cp_time / t, "-" if peak is None else "%.1f" % (peak / 1024)))
        print()
        print("'cp time / t' = how fast the operation is relative to a plain cp on the same disk (1.00 = as fast).")
    finally:
        if server is not None:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
