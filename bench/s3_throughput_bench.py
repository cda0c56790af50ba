#!/usr/bin/python3
"""Single-stream S3 throughput with a fast client: one 1 GiB GET and PUT with `curl` on presigned
URLs against Kiln, next to nginx serving (GET, static file) and storing (PUT, WebDAV) the same file
on the same disk. Prints wall seconds and the server's CPU seconds for each.

  KILN_BIN=build/src/cli/kiln /usr/bin/python3 bench/s3_throughput_bench.py [--size-mib 1024]
      [--runs 3] [--dir /path/on/disk] [--no-nginx]

Kiln runs `kiln server` on a fresh data dir under --dir; the URLs are presigned with botocore
(UNSIGNED-PAYLOAD, as any presigned PUT). nginx (Debian's nginx-light has the WebDAV module:
`nginx -V` lists --with-http_dav_module) runs as one process (master_process off, so its CPU is
one /proc entry) with `dav_methods PUT` and client_body_temp_path on the same filesystem. Rows:

  kiln PUT / GET      curl -T FILE <presigned PUT>, curl -o OUT <presigned GET>; Kiln fsyncs the
                      object before it answers the PUT
  nginx PUT           curl -T FILE to WebDAV (nginx writes the temp file and renames it; no fsync)
  nginx PUT + fsync   the same followed by `sync FILE` (fsync of the stored file): the fair
                      reference for Kiln's durable PUT
  nginx GET           curl -o OUT of the same file as a static file (sendfile)

Both clients send with `Expect:` cleared (no 100-continue round trip) and write GETs to a file on
the same disk, verified by SHA-256 afterwards (not timed). Each object is deleted (untimed) before
the next PUT, so no run pays for unlinking the previous one. "server CPU" is user+system time of
the server process over the request (all threads, from /proc/<pid>/stat). With --runs N the table
gives the best and the median wall time; CPU is the median.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import kiln_harness as kh  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of a whole process (all its threads), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def curl(*args, output="/dev/null"):
    subprocess.run(["curl", "-sS", "--fail", "-H", "Expect:", "-o", output] + list(args), check=True)


class Nginx:
    """nginx as a single foreground process serving `root` (GET) and accepting WebDAV PUTs into it."""

    def __init__(self, work):
        self.prefix = os.path.join(work, "nginx")
        self.root = os.path.join(self.prefix, "root")
        self.port = kh.free_port()
        for d in ("root", "body-tmp", "logs"):
            os.makedirs(os.path.join(self.prefix, d), exist_ok=True)
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write("""
daemon off;
master_process off;
worker_processes 1;
pid %(p)s/nginx.pid;
error_log %(p)s/logs/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    client_body_temp_path %(p)s/body-tmp;
    client_max_body_size 0;
    server {
        listen 127.0.0.1:%(port)d;
        root %(p)s/root;
        location / {
            dav_methods PUT DELETE;
            create_full_put_path on;
        }
    }
}
""" % {"p": self.prefix, "port": self.port})
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["nginx", "-p", self.prefix, "-e", os.path.join(self.prefix, "logs/error.log"),
                                      "-c", self.conf], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("nginx exited %s; see %s/logs/error.log" % (self.proc.returncode, self.prefix))
            try:
                status, _, _ = kh.http_request("GET", "http://127.0.0.1:%d/missing" % self.port, timeout=2)
                if status == 404:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("nginx did not answer")

    def url(self, name):
        return "http://127.0.0.1:%d/%s" % (self.port, name)

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3, help="repeat each row; best and median are printed")
    ap.add_argument("--dir", default=os.environ.get("KILN_BENCH_DIR", tempfile.gettempdir()),
                    help="where the file, the downloads and both servers' data go (one disk)")
    ap.add_argument("--no-nginx", action="store_true", help="skip the nginx rows")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="kiln-s3tp-", dir=args.dir)
    size = args.size_mib * 1024 * 1024
    src = os.path.join(work, "src.bin")
    out = os.path.join(work, "out.bin")
    server = nginx = None
    rows = []  # (name, wall times, cpu times)
    try:
        print("creating %d MiB file in %s ..." % (args.size_mib, work), flush=True)
        digest = kh.make_random_file(src, size)
        server = kh.KilnServer(os.path.join(work, "data"), log_level="info").start()
        s3 = server.client("s3", retries=3, signature_version="s3v4")
        s3.create_bucket(Bucket="bench")
        if not args.no_nginx:
            nginx = Nginx(work).start()

        def measure(name, pid, fn, before=None, after=None):
            walls, cpus = [], []
            for _ in range(args.runs):
                if before:
                    before()
                c0 = cpu_seconds(pid)
                t0 = time.perf_counter()
                fn()
                walls.append(time.perf_counter() - t0)
                cpus.append(cpu_seconds(pid) - c0)
                if after:
                    after()
            rows.append((name, walls, cpus))
            print("  %-20s best %6.2f s  median %6.2f s  server CPU %5.2f s" %
                  (name, min(walls), statistics.median(walls), statistics.median(cpus)), flush=True)

        def drop_out():
            if os.path.exists(out):
                os.unlink(out)

        def verify_out():
            assert kh.sha256_file(out) == digest, "downloaded bytes differ"
            drop_out()

        put_url = s3.generate_presigned_url("put_object", Params={"Bucket": "bench", "Key": "big.bin"},
                                            ExpiresIn=3600)
        get_url = s3.generate_presigned_url("get_object", Params={"Bucket": "bench", "Key": "big.bin"},
                                            ExpiresIn=3600)
        kpid = server.proc.pid

        def kiln_delete():
            s3.delete_object(Bucket="bench", Key="big.bin")

        measure("kiln PUT", kpid, lambda: curl("-T", src, put_url), before=kiln_delete)
        head = s3.head_object(Bucket="bench", Key="big.bin")
        assert head["ContentLength"] == size, head
        measure("kiln GET", kpid, lambda: curl(get_url, output=out), before=drop_out, after=verify_out)

        if nginx is not None:
            npid = nginx.proc.pid
            stored = os.path.join(nginx.root, "big.bin")

            def nginx_delete():
                if os.path.exists(stored):
                    os.unlink(stored)

            def put_sync():
                curl("-T", src, nginx.url("big.bin"))
                subprocess.run(["sync", stored], check=True)

            measure("nginx PUT", npid, lambda: curl("-T", src, nginx.url("big.bin")), before=nginx_delete)
            measure("nginx PUT + fsync", npid, put_sync, before=nginx_delete)
            assert kh.sha256_file(stored) == digest, "nginx stored bytes differ"
            measure("nginx GET", npid, lambda: curl(nginx.url("big.bin"), output=out), before=drop_out,
                    after=verify_out)

        print()
        print("%d MiB, one curl stream each, data on %s, %d CPUs, %d runs" % (args.size_mib, args.dir,
                                                                           os.cpu_count(), args.runs))
        print()
        print("| %-18s | %8s | %10s | %9s | %17s |" % ("operation", "best (s)", "median (s)", "MB/s", "server CPU (s)"))
        print("|%s|%s|%s|%s|%s|" % ("-" * 20, "-" * 10, "-" * 12, "-" * 11, "-" * 19))
        for name, walls, cpus in rows:
            print("| %-18s | %8.2f | %10.2f | %9.1f | %17.2f |" % (
                name, min(walls), statistics.median(walls), size / 1e6 / min(walls), statistics.median(cpus)))
    finally:
        if nginx is not None:
            nginx.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
