#!/usr/bin/python3
"""The operator's side of troupe, on a real cluster of this machine's processes: a head (with its
HTTP server), an on-demand node agent with one worker and a spot node agent with three.

  ops_test.py CASE TROUPE_BINARY SOURCE_DIR ARTIFACT_DIR

CASE:
  job_api    JobApiTest: `troupe job submit` returns at once and exits; the job runs on the
             cluster; a worker holding a rank is killed (kill -9); `troupe job status` reads the
             finished state, steps lost and the final CRC back, the CRC that of the same job run
             without a fault (deterministic mode: any world size and failures give the same
             weights); list, logs and wait agree.
  job_stop   JobApiTest: `troupe job stop` ends a running job: state stopped, every rank gone.
  driver_kill  JobApiTest: kill -9 of a `troupe train --head` driver fails its job, naming the
             driver, and its coordinator stops every rank.
  metrics    MetricsTest: /metrics scraped twice during a job with a fault, parsed with
             prometheus-client's parser: every family present, counters only grow, histograms
             consistent, one recovery whose duration is the job's `recovered` line's figure.
  dashboard  DashboardTest: the dashboard in headless Chromium against the running job after its
             fault: the chart's SVG holds a fault marker at the fault's step; a screenshot is
             saved in ARTIFACT_DIR.
  trace      TraceTest: `troupe job trace` and `troupe job plot` of a job with a fault.
  metrics_tls  MetricsTest: with TLS, /metrics over HTTPS to a client of the cluster's CA only
             (no cluster: the head alone).
  prometheus MetricsTest: Debian's prometheus scrapes the head every second during a job; its
             HTTP API answers `up`, the job's `troupe_job_step` and a `histogram_quantile` of
             `troupe_step_seconds`, its target is up; SIGTERM stops it, none left behind.
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.environ.get("TROUPE_DEPLOY_TOOLS", "/opt/troupe/deploy-tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ProcessCluster, fail, fail_before, run, wait_for  # noqa: E402
FAULT_STEP = 8


class Cluster(ProcessCluster):
    """The head, an on-demand node agent with one worker and a spot one with three."""

    def __init__(self, binary, tmp):
        super().__init__(binary, tmp)
        self.node("od", 1, "--resources", "cpu=1")
        self.node("s", 3, "--resources", "cpu=3", "--labels", "spot=true")
        self.wait_workers(4)

    def submit(self, *flags):
        spec = ["--workers", "4", "--work_dir", os.path.join(self.tmp, f"job{len(self.procs)}")]
        t0 = time.time()
        r = self.troupe("job", "submit", "--head", self.head, *spec, *flags)
        took = time.time() - t0
        job_id = r.stdout.strip().splitlines()[-1]
        if not re.fullmatch(r"job-\d+", job_id) or took > 10:
            fail(f"submit printed {r.stdout!r} after {took:.1f}s: expected a job id at once")
        return job_id


def job_api(c, art):
    job_id = c.submit("--steps", "30")
    c.wait_step(job_id, 5)
    # A worker of the spot node that holds a rank (not the coordinator's, on the on-demand node).
    cluster = json.loads(c.get("/api/cluster"))
    victims = [w for n in cluster["nodes"] if n["name"] == "s" for w in n["workers"]
               if any(".rank." in a for a in w["actors"])]
    if not victims:
        fail(f"no spot worker holds a rank: {json.dumps(cluster, indent=1)}")
    os.kill(victims[0]["pid"], signal.SIGKILL)
    print(f"killed worker {victims[0]['id']} (pid {victims[0]['pid']}) at step "
          f"{c.job(job_id)['step']}")
    c.finish(job_id)
    status = c.troupe("job", "status", job_id, "--head", c.head).stdout
    print(status)
    m = re.search(r"^job-\d+\s+\S+\s+(\w+)\n.*steps lost (\d+)\s+recoveries (\d+)\s+crc32c "
                  r"([0-9a-f]{8})", status, re.S | re.M)
    if not m or m.group(1) != "succeeded":
        fail(f"`troupe job status` does not say the job succeeded with its CRC:\n{status}")
    steps_lost, crc = int(m.group(2)), m.group(4)
    j = c.job(job_id)
    # (A kill from outside is no chaos fault: there is no `recovered` event to time it by.)
    if j["world"] != 3 or j["generation"] < 2:
        fail(f"expected the job to end on 3 ranks after a re-plan, got world {j['world']}, "
             f"generation {j['generation']}")
    if steps_lost != j["report"]["steps_lost"] or crc != j["report"]["crc32c"]:
        fail(f"status says {steps_lost} lost, crc {crc}; the driver reported {j['report']}")
    if "done: 30 steps" not in c.troupe("job", "logs", job_id, "--head", c.head).stdout:
        fail("`troupe job logs` lacks the driver's summary line")
    listed = c.troupe("job", "list", "--head", c.head).stdout
    if not re.search(rf"^{job_id}\s+succeeded\s", listed, re.M):
        fail(f"`troupe job list` does not list {job_id} as succeeded:\n{listed}")
    # The same job without a fault, on the 3 workers left: bit-identical weights.
    again = c.submit("--steps", "30", "--workers", "3")
    if c.finish(again)["report"]["crc32c"] != crc:
        fail(f"the faulted job's crc {crc} differs from the same job's without a fault: "
             f"{c.job(again)['report']}")
    print(f"{job_id}: succeeded, steps lost {steps_lost}, crc32c {crc} (= {again}'s, no fault)")


def job_stop(c, art):
    job_id = c.submit("--steps", "100000")
    c.wait_step(job_id, 3)
    r = c.troupe("job", "stop", job_id, "--head", c.head)
    w = c.troupe("job", "wait", job_id, "--head", c.head, "--timeout", "30s", check=False)
    j = c.job(job_id)
    if w.returncode != 1 or j["state"] != "stopped" or "troupe job stop" not in j["error"]:
        fail(f"after `troupe job stop`: wait exited {w.returncode}, job {j['state']}: "
             f"{j['error']}\n{r.stdout}{w.stdout}")

    def ranks_gone():
        cl = json.loads(c.get("/api/cluster"))
        held = [a for n in cl["nodes"] for w in n["workers"] for a in w["actors"]]
        return not held or None
    wait_for("every rank and the coordinator to be gone", ranks_gone, 20)
    print(f"{job_id} stopped at step {j['step']}: {j['error']}")


def driver_kill(c, art):
    """A `troupe train --head` driver killed (kill -9): its job fails naming the driver, and the
    coordinator stops every rank, so the workers are free for the next job."""
    log = open(os.path.join(c.tmp, "driver.log"), "w")
    d = subprocess.Popen([c.binary, "train", "--head", c.head, "--workers", "4", "--steps",
                          "100000", "--work_dir", os.path.join(c.tmp, "own")],
                         stdout=log, stderr=log, start_new_session=True)
    c.procs.append(d)
    jobs = wait_for("the driver's job", lambda: json.loads(c.get("/api/jobs"))["jobs"] or None, 30)
    job_id = jobs[0]["id"]
    if jobs[0]["submitted"]:
        fail(f"a `troupe train` job is listed as submitted: {jobs[0]}")
    c.wait_step(job_id, 3)
    os.kill(d.pid, signal.SIGKILL)
    d.wait()

    def all_gone():
        cl = json.loads(c.get("/api/cluster"))
        held = [a for n in cl["nodes"] for w in n["workers"] for a in w["actors"]]
        return (not held and c.job(job_id)["state"] == "failed") or None
    wait_for("the job failed and every rank gone", all_gone, 20)
    j = c.job(job_id)
    if "driver" not in j["error"]:
        fail(f"the job's error does not name its driver: {j['error']}")
    print(f"{job_id}: {j['error']}; its ranks and coordinator stopped")


def scrape(c):
    from prometheus_client.parser import text_string_to_metric_families
    text = c.get("/metrics")
    return {f.name: f for f in text_string_to_metric_families(text)}, text


FAMILIES = {  # name (as the parser gives it: no _total) -> type
    "troupe_members": "gauge", "troupe_membership_generation": "gauge",
    "troupe_jobs": "gauge", "troupe_job_step": "gauge", "troupe_job_loss": "gauge",
    "troupe_job_tokens_per_second": "gauge", "troupe_job_world_size": "gauge",
    "troupe_job_generation": "gauge", "troupe_job_recoveries": "counter",
    "troupe_job_steps_lost": "counter", "troupe_collective_bytes": "counter",
    "troupe_collective_seconds": "counter", "troupe_checkpoint_bytes": "gauge",
    "troupe_job_restarts": "counter", "troupe_step_seconds": "histogram",
    "troupe_recovery_seconds": "histogram", "troupe_checkpoint_write_seconds": "histogram",
}


def check_families(fams, text):
    for name, kind in FAMILIES.items():
        if name not in fams or fams[name].type != kind:
            fail(f"/metrics: expected a {kind} family {name}, got "
                 f"{fams[name].type if name in fams else 'none'}:\n{text}")
    for name, f in fams.items():
        if f.type != "histogram":
            continue
        by_labels = {}
        for s in f.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            by_labels.setdefault(key, []).append(s)
        for key, samples in by_labels.items():
            buckets = [s.value for s in samples if s.name.endswith("_bucket")]
            count = [s.value for s in samples if s.name.endswith("_count")]
            total = [s.value for s in samples if s.name.endswith("_sum")]
            if buckets != sorted(buckets) or not count or buckets[-1] != count[0] or total[0] < 0:
                fail(f"/metrics: histogram {name}{dict(key)} inconsistent: buckets {buckets}, "
                     f"count {count}, sum {total}")


def counters(fams):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in fams.values() if f.type in ("counter", "histogram") for s in f.samples}


def metrics(c, art):
    # A job that outlasts both scrapes however late they come (stopped at the end): a short one
    # could end before the first scrape on a loaded machine, and then no counter would grow.
    job_id = c.submit("--steps", "100000", "--chaos", f"kill-worker@{FAULT_STEP}")
    c.wait_step(job_id, 3)
    first, text1 = scrape(c)
    check_families(first, text1)
    # Two steps past the first scrape's: the ranks' steps of the one between were ingested after it.
    scraped_at = int(next(s.value for s in first["troupe_job_step"].samples
                          if s.labels == {"job_id": job_id}))
    j = c.wait_step(job_id, max(FAULT_STEP + 6, scraped_at + 2))
    if not any(e["event"] == "recovered" for e in c.job(job_id)["events"]):
        wait_for("the recovery", lambda: any(e["event"] == "recovered" for e in
                                              c.job(job_id)["events"]) or None, 60)
        j = c.job(job_id)
    second, text2 = scrape(c)
    check_families(second, text2)
    before, after = counters(first), counters(second)
    for key, v in before.items():
        if key in after and after[key] < v:
            fail(f"/metrics: counter {key} went from {v} to {after[key]}")
    lab = (("job_id", job_id),)
    rec_count = after[("troupe_recovery_seconds_count", lab)]
    rec_sum = after[("troupe_recovery_seconds_sum", lab)]
    recovered = [e for e in c.job(job_id)["events"] if e["event"] == "recovered"]
    line = [ln for ln in c.troupe("job", "logs", job_id, "--head", c.head).stdout.splitlines()
            if "| recovered: " in ln]
    if rec_count != 1 or len(recovered) != 1 or not line:
        fail(f"expected one recovery: histogram count {rec_count}, events {recovered}, "
             f"lines {line}")
    figure = float(re.search(r"recovered: ([0-9.]+) s", line[0]).group(1))
    if not 0 < rec_sum <= figure + 0.0005 or abs(rec_sum - figure) > 0.0005:
        fail(f"recovery duration {rec_sum}s on /metrics, the recovery line says {figure}: {line[0]}")
    for name in ("troupe_job_recoveries_total", "troupe_job_steps_lost_total"):
        if (name, lab) not in after:
            fail(f"/metrics: no {name} for {job_id}")
    if after[("troupe_collective_bytes_total", lab)] <= before.get(
            ("troupe_collective_bytes_total", lab), 0):
        fail(f"/metrics: collective bytes did not grow between the scrapes (steps "
             f"{scraped_at} and {j['step']})")
    print(f"{job_id}: 2 scrapes (steps {scraped_at} and {j['step']}), {len(second)} families; "
          f"recovery {rec_sum:.3f}s (line: {figure}s)")
    c.stop(job_id)



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prometheus(c):
    """Debian's prometheus scraping the head's /metrics every second; its HTTP API's address."""
    conf = os.path.join(c.tmp, "prometheus.yml")
    with open(conf, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: troupe\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{c.http}']\n")
    for _ in range(3):  # the free port may be taken before prometheus binds it: another one
        api = f"127.0.0.1:{free_port()}"
        log = open(os.path.join(c.tmp, "prometheus.log"), "w")
        p = subprocess.Popen(["/usr/bin/prometheus", f"--config.file={conf}",
                              f"--storage.tsdb.path={c.tmp}/tsdb", f"--web.listen-address={api}",
                              "--log.level=warn"],
                             stdout=log, stderr=log, start_new_session=True)

        def ready():
            if p.poll() is not None:
                return "exited"
            try:
                with urllib.request.urlopen(f"http://{api}/-/ready", timeout=2) as r:
                    return r.status == 200 and "ready"
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
                return None
        if wait_for("prometheus to be ready", ready, 30, 0.1) == "ready":
            return p, api
        if "address already in use" not in open(log.name).read():
            fail(f"prometheus exited {p.returncode}:\n{open(log.name).read()}")
    fail(f"prometheus found no free port:\n{open(log.name).read()}")


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(10)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def prometheus(c, art):
    """Debian's prometheus scrapes the head during a job; its HTTP API has the job's series,
    labelled `job_id` (Prometheus keeps `job` for its scrape job)."""
    p, api = start_prometheus(c)
    c.procs.append(p)  # killed with the cluster if a check below fails
    last = {}

    def query(q):
        url = f"http://{api}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        with urllib.request.urlopen(url, timeout=10) as r:
            last[q] = answer = json.loads(r.read().decode())
        if answer["status"] != "success":
            fail(f"prometheus: {q}: {answer}")
        return [float(v["value"][1]) for v in answer["data"]["result"]]

    def until(what, q, pred, timeout=30):
        def ok():
            vs = query(q)
            return vs if len(vs) == 1 and pred(vs[0]) else None
        try:
            return wait_for(f"{what}: {q}", ok, timeout, 0.5)[0]
        except AssertionError as e:
            fail(f"{e}; prometheus' last answer: {json.dumps(last.get(q))}")

    job_id = c.submit("--steps", "100000")
    c.wait_step(job_id, 3)
    until("the head up", 'up{job="troupe"}', lambda v: v == 1)
    step = until("the job's step", f'troupe_job_step{{job_id="{job_id}"}}',
                 lambda v: v >= 20)
    if step > c.job(job_id)["step"]:
        fail(f"prometheus has {job_id} at step {step}, the head at {c.job(job_id)['step']}")
    q50 = until("the median step time",
                f'histogram_quantile(0.5, sum by (le) (rate(troupe_step_seconds_bucket'
                f'{{job_id="{job_id}"}}[30s])))', lambda v: 0 < v < 60)
    with urllib.request.urlopen(f"http://{api}/api/v1/targets", timeout=10) as r:
        targets = json.loads(r.read().decode())["data"]["activeTargets"]
    if ([(t["scrapeUrl"], t["health"]) for t in targets]
            != [(f"http://127.0.0.1:{c.http}/metrics", "up")]):
        fail(f"prometheus' targets: {json.dumps(targets)}")
    c.stop(job_id)
    stop(p)
    if p.returncode != 0:
        fail(f"prometheus exited {p.returncode} on SIGTERM:\n"
             f"{open(os.path.join(c.tmp, 'prometheus.log')).read()}")
    left = subprocess.run(["pgrep", "-f", f"{c.tmp}/prometheus.yml"], capture_output=True,
                          text=True).stdout
    if left:
        fail(f"prometheus left behind: {left}")
    print(f"{job_id}: prometheus at {api} scraped the head: up, step {step:.0f}, median step "
          f"{q50 * 1000:.1f} ms; stopped at step {c.job(job_id)['step']}")


def dashboard(c, art):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import dashboard_check
    # With [eval] every 5 steps: the chart draws the validation losses beside the loss.
    spec = os.path.join(c.tmp, "eval.toml")
    with open(spec, "w") as f:
        f.write("[eval]\nevery = 5\nmicrobatches = 2\n")
    # Long enough never to end by itself while the page is checked (the test stops it): 400
    # steps ended under the suite's load while Chromium took 30 s to dump and screenshot the page.
    job_id = c.submit("--steps", "100000", "--chaos", f"kill-worker@{FAULT_STEP}", "--spec", spec)
    wait_for("the recovery", lambda: any(e["event"] == "recovered"
                                         for e in c.job(job_id)["events"]) or None, 120, 0.2)
    c.wait_step(job_id, FAULT_STEP + 4)
    j = c.job(job_id)
    if [v["step"] for v in j.get("val_series", [])][:2] != [5, 10] or j.get("val_loss") is None:
        fail(f"the head has no validation losses at steps 5 and 10: {j.get('val_series')}, "
             f"val_loss {j.get('val_loss')}")
    shot = os.path.join(art, "dashboard.png")
    dashboard_check.check(f"http://127.0.0.1:{c.http}/?job={job_id}", FAULT_STEP, shot,
                          val_steps=(5, 10))
    if c.job(job_id)["state"] != "running":
        fail("the job was not running while the page was checked")
    print(f"screenshot: {shot}")
    c.troupe("job", "stop", job_id, "--head", c.head)


def trace(c, art):
    job_id = c.submit("--steps", "24", "--chaos", f"kill-worker@{FAULT_STEP}")
    j = c.finish(job_id)
    out = os.path.join(art, "trace.json")
    svg = os.path.join(art, "plot.svg")
    c.troupe("job", "trace", job_id, "--head", c.head, "--out", out)
    c.troupe("job", "plot", job_id, "--head", c.head, "--out", svg)
    events = json.load(open(out))["traceEvents"]
    stacks, spans = {}, []
    for e in sorted((e for e in events if e["ph"] != "M"), key=lambda e: (e["tid"], e["ts"])):
        for k in ("ph", "ts", "pid", "tid", "name"):
            if k not in e:
                fail(f"trace event without {k}: {e}")
        if e["ph"] == "X":
            if e["dur"] < 0:
                fail(f"negative duration: {e}")
            spans.append(e)
        elif e["ph"] == "B":
            stacks.setdefault(e["tid"], []).append(e)
        elif e["ph"] == "E":
            if not stacks.get(e["tid"]):
                fail(f"an end without a begin: {e}")
            stacks[e["tid"]].pop()
    if any(stacks.values()):
        fail(f"begins without an end: {stacks}")
    # Children inside their parents: compute and collective within their rank's step span.
    by_tid = {}
    for s in spans:
        by_tid.setdefault(s["tid"], []).append(s)
    nested = 0
    for tid, ss in by_tid.items():
        steps = [s for s in ss if s["name"].startswith("step ")]
        for child in (s for s in ss if s["name"] in ("compute", "collective")):
            if not any(p["ts"] <= child["ts"] and child["ts"] + child["dur"] <= p["ts"] + p["dur"]
                       + 1 for p in steps):
                fail(f"{child} lies outside every step span of its thread")
            nested += 1
    job_steps = [e for e in events if e["ph"] == "B" and e["tid"] == 0
                 and e["name"].startswith("step ")]
    if len(job_steps) != j["report"]["committed_steps"] or len(job_steps) != 24:
        fail(f"{len(job_steps)} step spans on the job thread, {j['report']['committed_steps']} "
             f"committed steps")
    faults = [e for e in events if e["ph"] == "i" and e["name"].startswith("fault")]
    if [f["args"]["step"] for f in faults] != [FAULT_STEP]:
        fail(f"expected one fault instant at step {FAULT_STEP}, got {faults}")
    text = open(svg).read()
    if not text.startswith("<svg") or f'class="fault-marker" data-step="{FAULT_STEP}"' not in text:
        fail(f"the plot lacks the fault marker at step {FAULT_STEP}: {text[:300]}")
    print(f"{out}: {len(events)} events, {nested} nested spans, fault at {FAULT_STEP}; {svg}")


def metrics_tls(binary, tmp, art):
    """With TLS the head serves HTTPS, and only to a client of the cluster's CA."""
    import ssl
    run([binary, "certs", "--dir", f"{tmp}/certs", "--members", "head,scraper"])
    c = f"{tmp}/certs"
    log = open(f"{tmp}/head.log", "w")
    head = subprocess.Popen([binary, "head", "--port", "0", "--http_port", "0", "--http_port_file",
                             f"{tmp}/http", "--tls_ca", f"{c}/ca.pem", "--tls_cert",
                             f"{c}/head.pem", "--tls_key", f"{c}/head.key"],
                            stdout=log, stderr=log, start_new_session=True)
    try:
        port = wait_for("the head's HTTP port", lambda: Cluster.read(f"{tmp}/http"), 20)
        url = f"https://127.0.0.1:{port}/metrics"
        ctx = ssl.create_default_context(cafile=f"{c}/ca.pem")
        ctx.load_cert_chain(f"{c}/scraper.pem", f"{c}/scraper.key")
        text = urllib.request.urlopen(url, context=ctx, timeout=10).read().decode()
        if "troupe_members{" not in text:
            fail(f"/metrics over mutual TLS: {text[:200]}")
        anonymous = ssl.create_default_context(cafile=f"{c}/ca.pem")
        try:
            urllib.request.urlopen(url, context=anonymous, timeout=10).read()
            fail("the head served /metrics to a client without a certificate")
        except (ssl.SSLError, urllib.error.URLError, ConnectionError):
            pass
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            fail("the head served /metrics over plain HTTP with TLS on")
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
            pass
        print(f"https://127.0.0.1:{port}/metrics: served to the cluster's client only")
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()


def main():
    case, binary, _src, art = sys.argv[1:5]
    fail_before(270)  # CTest's TIMEOUT is 300 s (CMakeLists.txt)
    os.makedirs(art, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"troupe-ops-{case}-")
    c = None
    try:
        if case == "metrics_tls":
            metrics_tls(binary, tmp, art)
            return
        c = Cluster(binary, tmp)
        globals()[case](c, art)
    except AssertionError as e:
        signal.alarm(0)  # the dump below must not be cut short
        print(f"FAILED: {e}", file=sys.stderr)
        if c:
            print(c.logs(), file=sys.stderr)
        sys.exit(1)
    finally:
        signal.alarm(0)
        if c:
            c.close()
            left = c.leftovers()
            if left:
                print(f"FAILED: processes left behind: {left}", file=sys.stderr)
                sys.exit(1)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
