#!/usr/bin/env python3
"""Checks the head's dashboard (runtime/dashboard/index.html) in headless Chromium.

usage: dashboard_check.py URL FAULT_STEP SCREENSHOT_PATH

Loads URL with `chromium --headless=new --virtual-time-budget=8000 --dump-dom`, parses the DOM
and asserts that <svg id="chart"> holds an element of class fault-marker with
data-step == FAULT_STEP; then takes a 1280x900 screenshot to SCREENSHOT_PATH and asserts it is
a real PNG (> 10 KB). Exit 0 on success, 1 with a message on failure.

Virtual time lets the page's fetches complete before the DOM is dumped; should a dump still come
back before the page marked body[data-rendered="1"] (a slow head), it is dumped again until that
mark appears or DOM_DEADLINE_S passes.

Other test scripts: `from dashboard_check import check; check(url, fault_step, png)` raises
AssertionError. Standard library only. Runs as root, hence --no-sandbox.
"""
import html.parser
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 60          # each chromium run
DOM_DEADLINE_S = 30     # re-dumping the DOM until the page says it rendered
MIN_PNG_BYTES = 10 * 1024
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FLAGS = ["--headless=new", "--disable-gpu", "--no-sandbox", "--virtual-time-budget=8000",
         "--no-first-run", "--no-default-browser-check", "--hide-scrollbars"]


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("no chromium binary on PATH (Debian: apt-get install -y chromium)")


def run_chromium(args):
    """Runs chromium with FLAGS + args in a fresh profile; returns stdout (str)."""
    profile = tempfile.mkdtemp(prefix="dashboard-check-")
    try:
        cmd = [find_chromium(), *FLAGS, "--user-data-dir=" + profile, *args]
        # Its own process group, so that a timeout also ends its zygote/renderer children.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=profile, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"chromium took more than {TIMEOUT_S} s: {' '.join(cmd)}")
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-15:]
            raise AssertionError(f"chromium exited {proc.returncode}: {' '.join(cmd)}\n" + "\n".join(tail))
        return out.decode(errors="replace")
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class DomScan(html.parser.HTMLParser):
    """What the check needs from a dumped DOM."""
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
            "param", "source", "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []              # [(tag, in_chart)]
        self.rendered = None         # body's data-rendered
        self.chart_found = False
        self.faults = []             # [{step, kind, class}] inside the chart
        self.recoveries = []         # [step] inside the chart
        self.chart_paths = 0
        self.val_points = []         # [step] of the validation losses ([eval]) in the chart
        self.job_rows = []           # data-job-id values
        self.error_text = None       # the page's visible error line
        self._in_error = False

    def _in_chart(self):
        return bool(self.stack) and self.stack[-1][1]

    def _element(self, tag, attrs, closes):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        in_chart = self._in_chart()
        if tag == "body":
            self.rendered = a.get("data-rendered")
        if tag == "svg" and a.get("id") == "chart":
            self.chart_found = True
            in_chart = True
        if in_chart:
            if "fault-marker" in classes:
                self.faults.append({"step": a.get("data-step"), "kind": a.get("data-kind"),
                                    "class": a.get("class")})
            if "recovery-marker" in classes:
                self.recoveries.append(a.get("data-step"))
            if tag == "path" and "series" in classes:
                self.chart_paths += 1
            if "val-point" in classes:
                self.val_points.append(a.get("data-step"))
        if tag == "tr" and "data-job-id" in a:
            self.job_rows.append(a["data-job-id"])
        if a.get("id") == "error" and "hidden" not in a:
            self.error_text, self._in_error = "", True
        if not closes and tag not in self.VOID:
            self.stack.append((tag, in_chart))

    def handle_starttag(self, tag, attrs):
        self._element(tag, attrs, False)

    def handle_startendtag(self, tag, attrs):
        self._element(tag, attrs, True)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                if tag == "div":
                    self._in_error = False
                del self.stack[i:]
                return

    def handle_data(self, data):
        if self._in_error:
            self.error_text += data


def same_step(a, b):
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def dump_dom(url):
    """The page's DOM once it says it rendered (re-dumped until DOM_DEADLINE_S)."""
    deadline = time.monotonic() + DOM_DEADLINE_S
    tries = 0
    while True:
        tries += 1
        dom = run_chromium(["--dump-dom", url])
        scan = DomScan()
        scan.feed(dom)
        scan.close()
        if scan.rendered == "1" or time.monotonic() >= deadline:
            return scan, tries, len(dom)
        time.sleep(1)


def check(url, fault_step, screenshot, val_steps=()):
    """Raises AssertionError unless the dashboard at url charts a fault at fault_step (and a
    validation loss at each of val_steps) and a screenshot of it can be written to
    `screenshot`."""
    t0 = time.monotonic()
    scan, tries, size = dump_dom(url)
    print(f"dom: {size} bytes after {tries} dump(s), {time.monotonic() - t0:.1f} s; "
          f"data-rendered={scan.rendered!r}; job rows={scan.job_rows}; "
          f"chart={'yes' if scan.chart_found else 'no'} (series paths={scan.chart_paths}); "
          f"fault markers={[(f['step'], f['kind']) for f in scan.faults]}; "
          f"recovery markers={scan.recoveries}; validation points={scan.val_points}")
    if scan.error_text:
        print(f"page error line: {scan.error_text.strip()}")
    assert size > 0, f"chromium dumped an empty DOM for {url} (is it served? connection refused?)"
    assert scan.chart_found, f"no <svg id=\"chart\"> in the DOM of {url}" + (
        f" (page error: {scan.error_text.strip()})" if scan.error_text else "")
    assert scan.rendered == "1", (
        f"page never set body[data-rendered=1] within {DOM_DEADLINE_S} s" +
        (f" (page error: {scan.error_text.strip()})" if scan.error_text else ""))
    hits = [f for f in scan.faults if same_step(f["step"], fault_step)]
    assert hits, (f"no .fault-marker with data-step={fault_step} in #chart; markers: "
                  f"{[f['step'] for f in scan.faults]}")
    print(f"ok: fault marker at step {fault_step}: kind={hits[0]['kind']!r}")
    for step in val_steps:
        assert any(same_step(v, step) for v in scan.val_points), (
            f"no validation loss point (.val-point) at step {step} in #chart: "
            f"{scan.val_points}")
    if val_steps:
        print(f"ok: validation loss points at steps {list(val_steps)}")

    t1 = time.monotonic()
    screenshot = os.path.abspath(screenshot)
    os.makedirs(os.path.dirname(screenshot), exist_ok=True)
    if os.path.exists(screenshot):
        os.remove(screenshot)
    run_chromium(["--screenshot=" + screenshot, "--window-size=1280,900", url])
    assert os.path.isfile(screenshot), f"chromium wrote no screenshot to {screenshot}"
    with open(screenshot, "rb") as f:
        head = f.read(len(PNG_SIGNATURE))
    png_size = os.path.getsize(screenshot)
    assert head == PNG_SIGNATURE, f"{screenshot} is not a PNG (starts with {head!r})"
    assert png_size > MIN_PNG_BYTES, f"{screenshot} is only {png_size} bytes (blank page?)"
    print(f"ok: screenshot {screenshot}: {png_size} bytes, {time.monotonic() - t1:.1f} s")


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        check(argv[1], argv[2], argv[3])
    except AssertionError as e:
        print(f"FAIL: dashboard check: {e}", file=sys.stderr)
        return 1
    print("PASS: dashboard check")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
