#!/usr/bin/python3
"""The web console (issue 22): time to first render of the training job list, and the bytes of the
console's first load, in Debian's headless Chromium.

  /usr/bin/python3 bench/console_bench.py [--jobs 2000] [--runs 7]

Starts a `kiln server` ($KILN_BIN, default build/src/cli/kiln) whose capacity one long job holds,
so the jobs created after it stay queued (listing them costs no training). It signs in the way the
console does (one SigV4-signed POST /_kiln/console/session; the cookie goes into the browser), then
for each run opens /console/training-jobs in a FRESH browser profile (cold cache: every asset comes
over the wire) and reads the page's own performance entries:

  first render   navigation start -> performance.mark("kiln:list-rendered"), set when the list
                 first shows rows from ListTrainingJobs (the page's HTML, JS, CSS, the session
                 check, one ListTrainingJobs call of 50, the render)
  warm render    the same in the same profile a second time (assets from the HTTP cache: index.html
                 revalidated, hashed assets not requested at all)
  first load     bytes on the wire of the console's own files (transferSize: headers + the
                 compressed bodies), and their compressed and decoded body sizes; the API calls
                 are listed apart

Measured twice: with 20 jobs and with --jobs jobs, to show the list's cost does not grow with the
number of jobs (server-side paging). Medians over --runs.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import kiln_harness as kh  # noqa: E402
import training_helpers as th  # noqa: E402

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service as ChromeService  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def new_driver():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1366,860", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=ChromeService(executable_path=CHROMEDRIVER))


def console_cookie(server):
    body = b"{}"
    headers = {"Content-Type": "application/x-amz-json-1.1"}
    url = server.endpoint + "/_kiln/console/session"
    hdrs, _, _ = kh.sign_request("POST", url, headers, server.creds(), "sagemaker", body=body,
                                 signed_headers=["content-type", "host", "x-amz-date"])
    status, resp_headers, data = kh.http_request("POST", url, hdrs, body)
    assert status == 200, (status, data)
    cookie = resp_headers["set-cookie"].split(";")[0]
    name, _, value = cookie.partition("=")
    assert name == "kiln_session", cookie
    return value


READ_ENTRIES = """
const nav = performance.getEntriesByType('navigation')[0];
const mark = performance.getEntriesByName('kiln:list-rendered');
const res = performance.getEntriesByType('resource').map(r => ({
  name: r.name, type: r.initiatorType, transfer: r.transferSize, encoded: r.encodedBodySize,
  decoded: r.decodedBodySize, duration: r.duration}));
return JSON.stringify({render: mark.length ? mark[0].startTime : null,
  nav: {transfer: nav.transferSize, encoded: nav.encodedBodySize, decoded: nav.decodedBodySize,
        dcl: nav.domContentLoadedEventEnd}, res});
"""


def measure(server, cookie, path="training-jobs"):
    driver = new_driver()
    try:
        driver.get(server.endpoint + "/_kiln/health")
        driver.add_cookie({"name": "kiln_session", "value": cookie, "path": "/", "httpOnly": True,
                           "sameSite": "Strict"})
        out = []
        for _ in range(2):  # cold, then warm (same profile)
            driver.get(server.endpoint + "/console/" + path)
            WebDriverWait(driver, 60, poll_frequency=0.05).until(
                lambda d: d.execute_script("return performance.getEntriesByName('kiln:list-rendered').length"))
            out.append(json.loads(driver.execute_script(READ_ENTRIES)))
        return out
    finally:
        driver.quit()


def is_asset(entry):
    """The console's own files (/console/...), not its API calls (/, /_kiln/console/session)."""
    return urllib.parse.urlsplit(entry["name"]).path.startswith("/console/")


def summarize(label, runs):
    cold = [r[0] for r in runs]
    warm = [r[1] for r in runs]
    print("%s: first render median %.0f ms (best %.0f), warm %.0f ms" % (
        label, statistics.median(c["render"] for c in cold), min(c["render"] for c in cold),
        statistics.median(w["render"] for w in warm)))
    c = cold[0]
    assets = [r for r in c["res"] if is_asset(r)]
    api = [r for r in c["res"] if not is_asset(r)]
    wire = c["nav"]["transfer"] + sum(r["transfer"] for r in assets)
    encoded = c["nav"]["encoded"] + sum(r["encoded"] for r in assets)
    decoded = c["nav"]["decoded"] + sum(r["decoded"] for r in assets)
    print("  first load: %d B on the wire for %d files (%d B compressed bodies, %d B decoded)" % (
        wire, len(assets) + 1, encoded, decoded))
    for r in assets:
        print("    %-60s %7d B wire  %7d B body  %7d B decoded" % (r["name"].split("/console/")[-1][:60],
                                                                    r["transfer"], r["encoded"], r["decoded"]))
    for r in api:
        print("    api %-56s %7d B wire  %5.0f ms" % (urllib.parse.urlsplit(r["name"]).path[:56],
                                                      r["transfer"], r["duration"]))
    warm_wire = warm[0]["nav"]["transfer"] + sum(r["transfer"] for r in warm[0]["res"] if is_asset(r))
    print("  warm load: %d B on the wire" % warm_wire)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="kiln-console-bench-")
    server = kh.KilnServer(os.path.join(base, "data"), log_level="info",
                           config={"scheduler": {"policy": "strict", "allow_cpu_fallback": True, "cpus": 2,
                                                 "memory_gib": 8},
                                   "training": {"stop_grace_seconds": 2}})
    server.start()
    sm, s3 = server.client("sagemaker"), server.client("s3")
    names = []
    try:
        s3.create_bucket(Bucket="bench")
        sm.create_training_job(**th.training_request("hold", "bench", image=th.probe_image(),
                                                     hyperparameters={"sleep": "3600"}, max_runtime=7200))
        th.wait_for_status(sm, "hold", "InProgress", timeout=60)
        cookie = console_cookie(server)
        for count in (20, args.jobs):
            while len(names) < count:
                name = "bench-%05d" % len(names)
                sm.create_training_job(**th.training_request(name, "bench", image=th.probe_image(), max_runtime=60))
                names.append(name)
            runs = [measure(server, cookie) for _ in range(args.runs)]
            summarize("%d jobs" % (count + 1), runs)
    finally:
        for name in names:
            try:
                sm.stop_training_job(TrainingJobName=name)
            except Exception:  # noqa: BLE001 (best effort: the server goes next)
                pass
        sm.stop_training_job(TrainingJobName="hold")
        th.wait_for_status(sm, "hold", timeout=120)
        server.stop(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
