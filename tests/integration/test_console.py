"""The web console (issue 22) in a real browser: Debian's headless Chromium driven by Selenium
(chromium-driver, python3-selenium) against live servers.

Shown here: the console is served from the server's own port under /console/; signing in with an
access key (the browser SigV4-signs one request; the secret never leaves it) and refusing wrong
keys; a running PyTorch job's page whose log tail grows and whose loss chart gains points; an
endpoint's invocation chart after traffic; the object store browsed and downloaded from; a job
deleted while its page is open; a session that ends while a page is open; paging, filtering and
sorting 2,000 jobs served a page at a time. Screenshots of the main pages are written to
$KILN_TEST_ARTIFACTS/console (default: <build dir>/test-artifacts/console).

The DOM hooks used here are the console's test contract (ui/README.md)."""

import json
import os
import shutil
import time

import pytest
import requests
from botocore.exceptions import ClientError

import endpoint_helpers as eh
import kiln_harness as kh
import training_helpers as th

webdriver = pytest.importorskip("selenium.webdriver", reason="python3-selenium is not installed")
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service as ChromeService  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

KILN_CONFIG = {
    "scheduler": {"policy": "shrink", "allow_cpu_fallback": True},
    "endpoints": {"invocation_timeout_seconds": 5, "stop_grace_seconds": 5, "health_interval_seconds": 0.5},
    "training": {"stop_grace_seconds": 5},
}

ARTIFACTS = os.path.join(os.environ.get("KILN_TEST_ARTIFACTS") or os.path.join(kh.build_dir(), "test-artifacts"),
                         "console")


def _require_browser():
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("Debian's chromium and chromium-driver are needed for the console's browser tests "
                    "(scripts/install-deps.sh --test installs them)")


def new_driver(width=1366, height=860):
    _require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=%d,%d" % (width, height), "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture
def browser():
    drivers = []

    def make(**kwargs):
        d = new_driver(**kwargs)
        drivers.append(d)
        return d

    yield make
    for d in drivers:
        _fail_on_console_crash(d)
        d.quit()


def _fail_on_console_crash(driver):
    """Uncaught exceptions in the page are console crashes: fail the test with them."""
    try:
        entries = driver.get_log("browser")
    except WebDriverException:
        return
    crashes = [e["message"] for e in entries
               if e.get("level") == "SEVERE" and "Uncaught" in e.get("message", "")]
    assert not crashes, "the console threw:\n" + "\n".join(crashes)


@pytest.fixture(scope="module", autouse=True)
def _no_endpoint_left_behind(module_kiln):
    yield
    eh.delete_all_endpoints(module_kiln.client("sagemaker"))


def screenshot(driver, name):
    """The whole page (the window grown to the document's height, at most 2,400 px), as a PNG."""
    os.makedirs(ARTIFACTS, exist_ok=True)
    try:
        size = driver.get_window_size()
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(size["width"], min(max(int(height) + 140, size["height"]), 2400))
        driver.save_screenshot(os.path.join(ARTIFACTS, name + ".png"))
        driver.set_window_size(size["width"], size["height"])
    except WebDriverException:
        driver.save_screenshot(os.path.join(ARTIFACTS, name + ".png"))


def wait(driver, predicate, timeout=30, what="condition"):
    def guarded(d):
        try:
            return predicate(d)
        except (StaleElementReferenceException,):
            return False
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(guarded)
    except Exception:
        screenshot(driver, "failed-" + "".join(c if c.isalnum() else "-" for c in what)[:60])
        raise AssertionError("timed out after %ss waiting for %s at %s; page text:\n%s" % (
            timeout, what, driver.current_url, driver.find_element(By.TAG_NAME, "body").text[:3000]))


def find(driver, css):
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0] if found else None


def open_console(driver, server, path=""):
    driver.get(server.endpoint + "/console/" + path)
    wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1",
         what="the console's session check")


def sign_in(driver, server, access_key=None, secret_key=None, keyboard=False):
    open_console(driver, server)
    wait(driver, lambda d: find(d, "#signin-form"), what="the sign-in form")
    key = driver.find_element(By.ID, "access-key-id")
    secret = driver.find_element(By.ID, "secret-access-key")
    key.clear()
    secret.clear()
    if keyboard:
        # Everything by keyboard: focus the first field, type, Tab to the secret, Enter submits.
        key.click()
        key.send_keys(access_key or server.access_key, Keys.TAB)
        driver.switch_to.active_element.send_keys(secret_key or server.secret_key, Keys.ENTER)
    else:
        key.send_keys(access_key or server.access_key)
        secret.send_keys(secret_key or server.secret_key)
        driver.find_element(By.CSS_SELECTOR, "#signin-form button[type=submit]").click()


def signed_in(driver, server):
    sign_in(driver, server)
    wait(driver, lambda d: server.access_key in (find(d, "#whoami").text if find(d, "#whoami") else "")
         or "arn:aws:iam::" in (find(d, "#whoami").text if find(d, "#whoami") else ""), what="signed in")
    return driver


def attr_int(el, name):
    value = el.get_attribute(name)
    return int(value) if value not in (None, "") else 0


def chart(driver, metric):
    return find(driver, 'figure.metric-chart[data-metric="%s"]' % metric)


def session_cookie(driver):
    c = driver.get_cookie("kiln_session")
    return c["value"] if c else None


def console_api(server, cookie, target, payload, csrf=True, content_type="application/x-amz-json-1.1"):
    headers = {"X-Amz-Target": target, "Content-Type": content_type, "Cookie": "kiln_session=" + cookie}
    if csrf:
        headers["X-Kiln-Console"] = "1"
    return requests.post(server.endpoint + "/", data=json.dumps(payload), headers=headers, timeout=10)


# ---------------------------------------------------------------------------------------------


def test_console_is_served_from_the_server_port(module_kiln):
    r = requests.get(module_kiln.endpoint + "/console", allow_redirects=False, timeout=10)
    assert r.status_code in (301, 308) and r.headers["Location"].endswith("/console/"), (r.status_code, r.headers)
    r = requests.get(module_kiln.endpoint + "/console/", headers={"Accept-Encoding": "gzip"}, timeout=10)
    assert r.status_code == 200, r.text[:500]
    assert r.headers["Content-Type"].startswith("text/html")
    csp = r.headers.get("Content-Security-Policy", "")
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp, csp
    index = r.text
    # A history-API route falls back to the same page; assets are content-hashed and cached.
    deep = requests.get(module_kiln.endpoint + "/console/training-jobs/some-job", timeout=10)
    assert deep.status_code == 200 and deep.text == index
    scripts = [p.split('"')[0] for p in index.split('src="')[1:]]
    assert scripts, index
    asset = requests.get(module_kiln.endpoint + scripts[0] if scripts[0].startswith("/") else
                         module_kiln.endpoint + "/console/" + scripts[0], headers={"Accept-Encoding": "gzip"},
                         timeout=10)
    assert asset.status_code == 200
    assert "javascript" in asset.headers["Content-Type"]
    assert asset.headers.get("Content-Encoding") == "gzip"
    assert "immutable" in asset.headers.get("Cache-Control", "")
    again = requests.get(asset.url, headers={"If-None-Match": asset.headers["ETag"], "Accept-Encoding": "gzip"},
                         timeout=10)
    assert again.status_code == 304
    # Nothing outside this server is referenced by the page.
    assert "http://" not in index and "https://" not in index


def test_wrong_keys_are_refused(module_kiln, browser):
    driver = browser()
    sign_in(driver, module_kiln, access_key="AKIAUNKNOWNKEY000000", secret_key="whatever")
    error = wait(driver, lambda d: (find(d, "#signin-error") or None) and find(d, "#signin-error").text and
                 find(d, "#signin-error"), what="the unknown-key error")
    assert "access key" in error.text.lower(), error.text
    assert session_cookie(driver) is None
    screenshot(driver, "signin-refused")

    sign_in(driver, module_kiln, secret_key=module_kiln.secret_key[:-4] + "AAAA")
    wait(driver, lambda d: "secret" in (find(d, "#signin-error").text.lower() if find(d, "#signin-error") else ""),
         what="the wrong-secret error")
    assert session_cookie(driver) is None
    assert find(driver, "#whoami") is None
    # The secret typed was not kept anywhere the page can read back.
    assert driver.execute_script("return JSON.stringify(window.localStorage) + JSON.stringify(window.sessionStorage)") \
        .find(module_kiln.secret_key[:12]) < 0


def test_sign_in_by_keyboard_and_sign_out(module_kiln, browser):
    driver = browser()
    sign_in(driver, module_kiln, keyboard=True)
    wait(driver, lambda d: find(d, "#whoami") and "arn:aws:iam::" in find(d, "#whoami").text, what="signed in")
    nav = driver.find_element(By.CSS_SELECTOR, 'nav[aria-label="Main"]')
    links = [a.text for a in nav.find_elements(By.TAG_NAME, "a")]
    for label in ("Training jobs", "Endpoints", "Models", "Endpoint configs", "Tuning jobs", "Processing jobs",
                  "Transform jobs", "Object store"):
        assert label in links, links
    cookie = session_cookie(driver)
    assert cookie and len(cookie) >= 32
    c = driver.get_cookie("kiln_session")
    assert c.get("httpOnly") is True and c.get("sameSite") == "Strict", c
    assert driver.execute_script("return document.cookie").find("kiln_session") < 0

    # The session is the key's authority for every API, and nothing more: a cookie without the
    # console's header cannot change anything (cross-site forms cannot set headers).
    r = console_api(module_kiln, cookie, "SageMaker.ListTrainingJobs", {})
    assert r.status_code == 200, r.text
    r = console_api(module_kiln, cookie, "SageMaker.ListTrainingJobs", {}, csrf=False)
    assert r.status_code == 403, r.text

    driver.find_element(By.ID, "sign-out").click()
    wait(driver, lambda d: find(d, "#signin-form"), what="the sign-in form after signing out")
    r = console_api(module_kiln, cookie, "SageMaker.ListTrainingJobs", {})
    assert r.status_code == 400 and "ExpiredToken" in r.text, (r.status_code, r.text)


def test_a_session_ended_elsewhere_returns_the_page_to_sign_in(module_kiln, browser):
    driver = signed_in(browser(), module_kiln)
    open_console(driver, module_kiln, "training-jobs")
    wait(driver, lambda d: find(d, "#resource-table"), what="the training job list")
    cookie = session_cookie(driver)
    r = requests.delete(module_kiln.endpoint + "/_kiln/console/session",
                        headers={"Cookie": "kiln_session=" + cookie, "X-Kiln-Console": "1"}, timeout=10)
    assert r.status_code == 200, r.text
    # The list polls: its next call is refused, and the console asks to sign in again, saying why.
    form = wait(driver, lambda d: find(d, "#signin-form"), timeout=30, what="sign-in after the session ended")
    assert form is not None
    assert "sign in" in driver.find_element(By.TAG_NAME, "body").text.lower()


@pytest.fixture
def pytorch_job(module_kiln):
    """A PyTorch job of 80 half-second epochs, stopped once its test is done (it holds the 2-core
    host's capacity while it runs)."""
    sm, s3 = module_kiln.client("sagemaker"), module_kiln.client("s3")
    bucket = th.unique_name("console")
    s3.create_bucket(Bucket=bucket)
    with open(os.path.join(th.JOBS_DIR, "console_pytorch", "train.py"), "rb") as f:
        s3.put_object(Bucket=bucket, Key="code/sourcedir.tar.gz", Body=th.make_tar_gz({"train.py": f.read()}))
    name = th.unique_name("console-pt")
    hps = {"epochs": "80", "interval": "0.5",
           "sagemaker_program": json.dumps("train.py"),
           "sagemaker_submit_directory": json.dumps("s3://%s/code/sourcedir.tar.gz" % bucket),
           "sagemaker_region": json.dumps("us-east-1")}
    req = th.training_request(name, bucket, image=th.PYTORCH_IMAGE, hyperparameters=hps,
                              instance_type="ml.m5.xlarge", max_runtime=600)
    req["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": "train:loss", "Regex": "loss=([0-9.]+)"}]
    sm.create_training_job(**req)
    yield {"name": name, "bucket": bucket}
    try:
        sm.stop_training_job(TrainingJobName=name)
    except ClientError:
        pass
    th.wait_for_status(sm, name, timeout=120)


def test_a_running_pytorch_jobs_log_grows_and_its_loss_chart_gains_points(module_kiln, browser, pytorch_job):
    sm = module_kiln.client("sagemaker")
    name = pytorch_job["name"]
    th.wait_for_status(sm, name, "InProgress", timeout=60)
    driver = signed_in(browser(), module_kiln)

    # The list shows it; its row leads to the job page.
    open_console(driver, module_kiln, "training-jobs")
    row = wait(driver, lambda d: find(d, 'tr[data-name="%s"]' % name), what="the job's row")
    row.find_element(By.TAG_NAME, "a").click()
    wait(driver, lambda d: find(d, "#resource-title") and find(d, "#resource-title").text == name, what="job page")

    log = wait(driver, lambda d: find(d, "#log-tail") if attr_int(find(d, "#log-tail"), "data-line-count") >= 2
               else None, timeout=90, what="the first log lines")
    loss = wait(driver, lambda d: chart(d, "train:loss") if chart(d, "train:loss") is not None
                and attr_int(chart(d, "train:loss"), "data-points") >= 2 else None,
                timeout=90, what="two points on the loss chart")
    lines_before = attr_int(log, "data-line-count")
    points_before = attr_int(loss, "data-points")
    assert sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"
    # No reload: the page keeps polling while the job runs.
    wait(driver, lambda d: attr_int(find(d, "#log-tail"), "data-line-count") >= lines_before + 4,
         timeout=60, what="the log tail to grow")
    wait(driver, lambda d: attr_int(chart(d, "train:loss"), "data-points") >= points_before + 4,
         timeout=60, what="the loss chart to gain points")
    text = find(driver, "#log-tail").text
    assert "epoch=" in text and "loss=" in text, text[-500:]
    assert "InProgress" in find(driver, "#resource-status").text or "Training" in find(driver, "#resource-status").text
    canvas = find(driver, 'figure.metric-chart[data-metric="train:loss"] canvas')
    assert canvas is not None and canvas.size["width"] > 100
    screenshot(driver, "training-job")
    open_console(driver, module_kiln, "training-jobs")
    wait(driver, lambda d: find(d, 'tr[data-name="%s"]' % name), what="the list")
    screenshot(driver, "training-jobs")


def test_a_job_deleted_while_open_says_so(module_kiln, browser):
    sm, s3 = module_kiln.client("sagemaker"), module_kiln.client("s3")
    bucket = th.unique_name("console-del")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("console-del")
    sm.create_training_job(**th.training_request(name, bucket, image=th.probe_image(),
                                                 hyperparameters={"lines": "3"}))
    th.wait_for_status(sm, name, timeout=90)
    driver = signed_in(browser(), module_kiln)
    open_console(driver, module_kiln, "training-jobs/" + name)
    wait(driver, lambda d: find(d, "#resource-title") and find(d, "#resource-title").text == name, what="job page")
    # A job with no metric definitions and finished logs: no hang, no spinner forever.
    # DeleteTrainingJob is newer than Debian's boto3: the same call, signed by the harness.
    status, _, body = kh.json_request(module_kiln, "SageMaker.DeleteTrainingJob", {"TrainingJobName": name})
    assert status == 200, body
    error = wait(driver, lambda d: find(d, "#page-error") if find(d, "#page-error") and
                 "exist" in find(d, "#page-error").text.lower() else None, timeout=30, what="the deleted message")
    assert name in error.text or "training job" in error.text.lower(), error.text


def test_a_huge_log_shows_its_tail_without_hanging(module_kiln, browser):
    """200,000 lines in the job's stream: the page asks for the tail only and keeps at most 2,000
    lines in the DOM, saying how many it left out."""
    sm, s3 = module_kiln.client("sagemaker"), module_kiln.client("s3")
    bucket = th.unique_name("console-log")
    s3.create_bucket(Bucket=bucket)
    name = th.unique_name("console-log")
    sm.create_training_job(**th.training_request(name, bucket, image=th.probe_image(),
                                                 hyperparameters={"lines": "200000"}))
    assert th.wait_for_status(sm, name, timeout=180)["TrainingJobStatus"] == "Completed"
    driver = signed_in(browser(), module_kiln)
    started = time.monotonic()
    open_console(driver, module_kiln, "training-jobs/" + name)
    log = wait(driver, lambda d: find(d, "#log-tail") if "line 199999" in (find(d, "#log-tail").text
               if find(d, "#log-tail") else "") else None, timeout=30, what="the log's last line")
    print("a 200,000-line log's tail shown %.2f s after navigating" % (time.monotonic() - started))
    assert len(driver.find_elements(By.CSS_SELECTOR, "#log-tail .log-line")) <= 2000
    assert 0 < attr_int(log, "data-line-count") < 200000


def test_an_endpoint_page_shows_invocations_after_traffic(module_kiln, browser):
    sm = module_kiln.client("sagemaker")
    rt = module_kiln.client("sagemaker-runtime")
    name = eh.unique_name("console-ep")
    eh.create_model(sm, name + "-m", env={"VARIANT_TAG": "console"})
    eh.deploy(sm, name, [("AllTraffic", name + "-m", 1, 1.0)], server=module_kiln)
    driver = signed_in(browser(), module_kiln)
    open_console(driver, module_kiln, "endpoints/" + name)
    wait(driver, lambda d: find(d, "#resource-title") and find(d, "#resource-title").text == name, what="endpoint page")
    wait(driver, lambda d: "InService" in find(d, "#resource-status").text, what="InService")
    assert "AllTraffic" in driver.find_element(By.TAG_NAME, "main").text
    # Before any traffic the chart says so (a metric with no points is not an empty frame or a spinner).
    wait(driver, lambda d: chart(d, "Invocations") is not None and "No data points yet" in chart(d, "Invocations").text,
         what="the empty Invocations chart")
    for i in range(25):
        eh.invoke(rt, name, body=json.dumps({"i": i}).encode())
    with pytest.raises(ClientError):  # one client error for the error chart
        rt.invoke_endpoint(EndpointName=name, Body=b"{}", ContentType="application/json", TargetVariant="Nope")
    invocations = wait(driver, lambda d: chart(d, "Invocations") if chart(d, "Invocations") is not None
                       and float(chart(d, "Invocations").get_attribute("data-sum") or 0) >= 25 else None,
                       timeout=90, what="25 invocations on the chart")
    assert attr_int(invocations, "data-points") >= 1
    assert chart(driver, "ModelLatency") is not None
    screenshot(driver, "endpoint")
    open_console(driver, module_kiln, "endpoints")
    wait(driver, lambda d: find(d, 'tr[data-name="%s"]' % name), what="the endpoint list")
    sm.delete_endpoint(EndpointName=name)


def test_the_object_store_is_browsed_and_downloaded_from(module_kiln, browser):
    s3 = module_kiln.client("s3")
    bucket = th.unique_name("console-objects")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="models/run-1/model.tar.gz", Body=b"model bytes")
    s3.put_object(Bucket=bucket, Key="models/run-2/model.tar.gz", Body=b"x" * 2048)
    s3.put_object(Bucket=bucket, Key="readme.txt", Body=b"hello from the object store")
    driver = signed_in(browser(), module_kiln)
    open_console(driver, module_kiln, "objects")
    wait(driver, lambda d: find(d, 'tr[data-name="%s"]' % bucket), what="the bucket")
    open_console(driver, module_kiln, "objects/" + bucket)
    wait(driver, lambda d: find(d, 'tr[data-name="models/"]') and find(d, 'tr[data-name="readme.txt"]'),
         what="the bucket's top level (a prefix and an object)")
    find(driver, 'tr[data-name="models/"] a').click()
    wait(driver, lambda d: find(d, 'tr[data-name="models/run-1/"]') and find(d, 'tr[data-name="models/run-2/"]'),
         what="the prefix's sub-prefixes")
    screenshot(driver, "objects")
    open_console(driver, module_kiln, "objects/" + bucket)
    link = wait(driver, lambda d: find(d, 'tr[data-name="readme.txt"] a[href]'), what="the download link")
    href = link.get_attribute("href")
    # The link downloads with the session cookie alone (a plain GET; no key in the URL).
    r = requests.get(href, headers={"Cookie": "kiln_session=" + session_cookie(driver)}, timeout=10)
    assert r.status_code == 200 and r.content == b"hello from the object store", (r.status_code, r.text[:300])
    assert "X-Amz-Signature" not in href and module_kiln.access_key not in href
    assert requests.get(href, timeout=10).status_code == 403  # and nothing without it


def test_paging_filtering_and_sorting_2000_jobs(kiln_factory, browser):
    # A server of its own whose capacity one long job holds: the 2,000 jobs after it stay queued
    # (InProgress/Pending), so listing them costs no training.
    server = kiln_factory("paging", config={"scheduler": {"policy": "strict", "allow_cpu_fallback": True,
                                                          "cpus": 2, "memory_gib": 8},
                                                  "training": {"stop_grace_seconds": 2}})
    sm, s3 = server.client("sagemaker"), server.client("s3")
    s3.create_bucket(Bucket="paging")
    hold = "hold-capacity"
    sm.create_training_job(**th.training_request(hold, "paging", image=th.probe_image(),
                                                 hyperparameters={"sleep": "900"}, max_runtime=1200))
    th.wait_for_status(sm, hold, "InProgress", timeout=60)
    names = ["page-%04d" % i for i in range(2000)]
    try:
        for n in names:
            sm.create_training_job(**th.training_request(n, "paging", image=th.probe_image(), max_runtime=60))
        driver = signed_in(browser(), server)
        open_console(driver, server, "training-jobs")
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#resource-table tbody tr[data-name]")) > 0,
             what="the first page")
        render_ms = driver.execute_script(
            "const m = performance.getEntriesByName('kiln:list-rendered'); return m.length ? m[0].startTime : null")
        assert render_ms is not None, "the list did not mark its first render"

        def rows(d):  # one WebDriver round trip, not one per row
            return d.execute_script("return Array.from(document.querySelectorAll("
                                    "'#resource-table tbody tr[data-name]'), r => r.dataset.name)")

        # Newest first by default; every page is one ListTrainingJobs call of 50.
        first = rows(driver)
        assert first == ["page-%04d" % i for i in range(1999, 1949, -1)], first[:5]
        assert find(driver, "#prev-page").get_attribute("disabled") is not None
        screenshot(driver, "training-jobs-2000")
        seen = list(first)
        for page in range(2, 42):
            before = rows(driver)
            button = find(driver, "#next-page")
            if button.get_attribute("disabled") is not None:
                break
            button.click()
            wait(driver, lambda d: (lambda now: now and now != before)(rows(d)), what="page %d" % page)
            seen += rows(driver)
            assert ("Page %d" % page) in find(driver, "#page-status").text, find(driver, "#page-status").text
        assert len(seen) == 2001 and set(seen) == set(names) | {hold}, len(seen)
        assert find(driver, "#next-page").get_attribute("disabled") is not None
        screenshot(driver, "training-jobs-last-page")
        find(driver, "#prev-page").click()
        wait(driver, lambda d: "Page 40" in find(d, "#page-status").text, what="back to page 40")

        # Filtering is the server's: a name filter over all 2,000.
        box = find(driver, "#name-filter")
        box.send_keys("page-123")
        wait(driver, lambda d: sorted(rows(d)) == ["page-123%d" % i for i in range(10)],
             what="the name filter's 10 jobs")
        # As a person clears it (WebElement.clear() fires no input event).
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(Keys.BACK_SPACE)
        wait(driver, lambda d: len(rows(d)) == 50, what="the filter cleared")
        Select(find(driver, "#status-filter")).select_by_value("InProgress")
        wait(driver, lambda d: len(rows(d)) == 50 and "page-1999" in rows(d), what="the status filter")
        # Sorting by name (a header button): ascending puts page-0000 first.
        header = driver.find_element(By.XPATH, "//th[.//button[normalize-space()='Name']]")
        header.find_element(By.TAG_NAME, "button").click()
        wait(driver, lambda d: header.get_attribute("aria-sort") in ("ascending", "descending"), what="aria-sort")
        if header.get_attribute("aria-sort") == "descending":
            header.find_element(By.TAG_NAME, "button").click()
            wait(driver, lambda d: header.get_attribute("aria-sort") == "ascending", what="ascending")
        wait(driver, lambda d: rows(d) and rows(d)[0] == "hold-capacity", what="sorted by name ascending")
        print("first render of the job list with 2,001 jobs: %.0f ms after navigation start" % render_ms)
    finally:
        for n in names:
            try:
                sm.stop_training_job(TrainingJobName=n)
            except ClientError:
                pass
        sm.stop_training_job(TrainingJobName=hold)
        th.wait_for_status(sm, hold, timeout=120)
