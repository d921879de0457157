#!/usr/bin/python3
"""SchedulingTest: many jobs on one cluster of real processes, placed by the head as gangs.

  scheduling_test.py CASE TROUPE_BINARY
A head and three node agents (zones a, b, c; 2 workers and cpu=2 each: 6 workers) on this
machine; jobs submitted with `troupe job submit`, each with its own spec. Every job trains the
same model from the same seed, so in deterministic mode every one ends with the same weights (the
reference: `troupe train` on an embedded cluster), whatever its world did on the way.
CASE: share, queue, grow, priority, never_fits, kill.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ops"))
from harness import ProcessCluster, fail, fail_before, wait_for  # noqa: E402

STEPS = 40
LONG = 200  # steps of a job that must still run while the test acts on it


class Cluster(ProcessCluster):
    """The head and three node agents, zones a, b and c, 2 workers and cpu=2 each."""

    def __init__(self, binary, tmp):
        super().__init__(binary, tmp)
        self.data = os.path.join(tmp, "data")
        for zone in "abc":
            self.node(zone, 2, "--resources", "cpu=2", "--labels", f"zone={zone}")
        self.wait_workers(6)

    def api(self, path):
        return json.loads(self.get(path))

    def spec(self, name, workers, min_workers, max_workers, priority=0, steps=STEPS, chaos=(),
             rank_resources=""):
        path = os.path.join(self.tmp, f"{name}.toml")
        faults = ", ".join(f'"{f}"' for f in chaos)
        with open(path, "w") as f:
            f.write(f'[job]\nname = "{name}"\nsteps = {steps}\npriority = {priority}\n'
                    f'work_dir = "{self.tmp}/{name}"\n'
                    f'[model]\ndata_dir = "{self.data}"\n'
                    f'[elastic]\nworkers = {workers}\nmin_workers = {min_workers}\n'
                    f'max_workers = {max_workers}\nrank_resources = "{rank_resources}"\n'
                    f'[chaos]\nfaults = [{faults}]\n')
        return path

    def submit(self, name, workers, min_workers, max_workers, **kw):
        spec = self.spec(name, workers, min_workers, max_workers, **kw)
        r = self.troupe("job", "submit", "--head", self.head, "--spec", spec)
        job_id = r.stdout.strip().splitlines()[-1]
        if not re.fullmatch(r"job-\d+", job_id):
            fail(f"submit printed {r.stdout!r}: expected a job id")
        return job_id

    def state(self, job_id, *states, timeout=90):
        def reached():
            j = self.job(job_id)
            if j["state"] in ("failed", "stopped") and j["state"] not in states:
                fail(f"job {job_id} {j['state']}: {j['error']}\n{self.logs()}")
            return j if j["state"] in states else None
        return wait_for(f"{job_id} {'/'.join(states)}", reached, timeout, 0.2)

    def ranks(self, name):
        """The workers, and their nodes, hosting job `name`'s rank actors now."""
        out = {}
        for node in self.api("/api/cluster")["nodes"]:
            for w in node["workers"]:
                for a in w["actors"]:
                    if a.startswith(f"{name}.") and ".rank." in a:
                        out[w["id"]] = node["name"]
        return out

    def coordinator(self, name):
        """The worker hosting job `name`'s coordinator now, or None."""
        for node in self.api("/api/cluster")["nodes"]:
            for w in node["workers"]:
                if any(a.startswith(f"{name}.") and a.endswith(".coordinator")
                       for a in w["actors"]):
                    return w["id"]
        return None

    def worker_pid(self, worker):
        for node in self.api("/api/cluster")["nodes"]:
            for w in node["workers"]:
                if w["id"] == worker:
                    return w["pid"]
        fail(f"no worker {worker}")


def reference(c, steps=STEPS):
    """The weights' crc32c of the same job trained alone on an embedded cluster."""
    r = c.troupe("train", "--spec", c.spec(f"ref{steps}", 2, 1, 8, steps=steps), timeout=180)
    m = re.search(r"params crc32c ([0-9a-f]{8})", r.stdout)
    if not m:
        fail(f"no crc in the reference run:\n{r.stdout}\n{r.stderr}")
    return m.group(1)


def crc(j):
    return j["report"]["crc32c"]


def check_crc(c, jobs, ref):
    for job_id in jobs:
        j = c.finish(job_id)
        if crc(j) != ref:
            fail(f"{job_id} ended with crc32c {crc(j)}, the reference run with {ref}")


def share(c):
    """Two jobs of 3 ranks on 6 workers: each its gang, over the three zones, both to the
    reference weights."""
    ref = reference(c, LONG)
    a = c.submit("A", 3, 3, 3, steps=LONG)
    b = c.submit("B", 3, 3, 3, steps=LONG)
    c.wait_step(a, 2)
    c.wait_step(b, 2)
    ra = wait_for("A's 3 ranks", lambda: (lambda r: r if len(r) == 3 else None)(c.ranks("A")))
    rb = wait_for("B's 3 ranks", lambda: (lambda r: r if len(r) == 3 else None)(c.ranks("B")))
    if set(ra) & set(rb):
        fail(f"A and B share a worker: A {ra}, B {rb}")
    for name, r in (("A", ra), ("B", rb)):
        if sorted(r.values()) != ["a", "b", "c"]:
            fail(f"job {name}'s ranks are not spread over the three zones: {r}")
    ca = wait_for("A's coordinator", lambda: c.coordinator("A"))
    cb = wait_for("B's coordinator", lambda: c.coordinator("B"))
    if ca in rb or cb in ra:
        fail(f"a coordinator shares a worker with the other job's rank: A's on {ca} (B's ranks "
             f"{sorted(rb)}), B's on {cb} (A's ranks {sorted(ra)})")
    check_crc(c, [a, b], ref)
    print(f"A on {ra} (coordinator {ca}), B on {rb} (coordinator {cb}); both crc32c {ref}")


def queue(c):
    """A third job queues while two run and starts when one ends; a fourth, of the same priority
    and smaller, submitted after it, does not overtake it (first come, first served)."""
    ref = reference(c)
    a = c.submit("A", 3, 3, 3, steps=STEPS * 50)
    b = c.submit("B", 3, 3, 3, steps=STEPS * 50)
    c.wait_step(a, 2)
    c.wait_step(b, 2)
    q = c.submit("C", 3, 3, 3)
    j = c.state(q, "queued")
    if "min_workers=3" not in j["waiting"]:
        fail(f"the queued job says {j['waiting']!r}: expected why (its min_workers=3)")
    d = c.submit("D", 2, 2, 2)
    jd = wait_for("D queued behind C",
                  lambda: (lambda x: x if q in x["waiting"] else None)(c.job(d)), 30, 0.2)
    listing = c.troupe("job", "list", "--head", c.head).stdout
    if not re.search(rf"{q}\s.*queued.*min_workers=3", listing):
        fail(f"`troupe job list` does not show {q} queued, and why:\n{listing}")
    status = c.troupe("job", "status", d, "--head", c.head).stdout
    if "waiting: needs min_workers=2" not in status or q not in status:
        fail(f"`troupe job status {d}` does not say why it waits:\n{status}")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{c.http}/metrics", timeout=10).read()
    if 'troupe_jobs{state="queued"} 2' not in metrics.decode():
        fail(f"/metrics: expected troupe_jobs{{state=\"queued\"}} 2:\n{metrics.decode()}")
    c.troupe("job", "stop", a, "--head", c.head)
    c.state(q, "running", "succeeded")
    if c.job(d)["state"] != "queued":
        fail(f"D overtook C or ran beside it: D {c.job(d)['state']}")
    c.troupe("job", "stop", b, "--head", c.head)
    check_crc(c, [q, d], ref)
    print(f"C queued ({j['waiting']}), ran when A was stopped; D waited ({jd['waiting']}), ran when B "
          f"was stopped; crc32c {ref}")


def grow(c):
    """E (2..6 ranks) gets the 3 workers B leaves free, and grows to 6 at a step boundary when B
    is stopped; its weights are the reference's."""
    ref = reference(c, LONG)
    b = c.submit("B", 3, 3, 3, steps=STEPS * 50)
    c.wait_step(b, 2)
    e = c.submit("E", 2, 2, 6, steps=LONG)
    c.wait_step(e, 2)
    if len(c.ranks("E")) != 3 or c.job(e)["world"] != 3:
        fail(f"E should hold the 3 free workers: {c.ranks('E')}, world {c.job(e)['world']}")
    c.troupe("job", "stop", b, "--head", c.head)
    wait_for("E to grow to 6 ranks", lambda: c.job(e)["world"] == 6, 60, 0.2)
    check_crc(c, [e], ref)
    print(f"E grew from world 3 to 6 when B was stopped; crc32c {ref}")


def priority(c):
    """H (priority 10, 4 ranks) arrives while E (priority 0, 2..6 ranks) holds all 6 workers: E
    hands 4 ranks over at a step boundary and goes on with its min, losing nothing; both end
    with the reference weights."""
    ref = reference(c, LONG)
    e = c.submit("E", 6, 2, 6, steps=LONG)
    c.wait_step(e, 3)
    if c.job(e)["world"] != 6:
        fail(f"E should hold all 6 workers: world {c.job(e)['world']}")
    h = c.submit("H", 4, 4, 4, priority=10, steps=LONG)
    c.state(h, "running", timeout=60)
    wait_for("E shrunk to its min_workers=2", lambda: c.job(e)["world"] == 2, 60, 0.1)
    if c.job(h)["world"] not in (0, 4):
        fail(f"H should train with 4 ranks: world {c.job(h)['world']}")
    check_crc(c, [h], ref)
    j = c.finish(e)
    if crc(j) != ref or j["report"]["steps_lost"] != 0:
        fail(f"E: crc32c {crc(j)} (reference {ref}), steps lost {j['report']['steps_lost']}")
    print(f"H (priority 10) took 4 of E's 6 workers; E: 0 steps lost, crc32c {ref}")


def never_fits(c):
    """A job whose minimum no node set here could ever hold waits, saying why, and holds up no
    one: 7 ranks on 6 workers; ranks asking for a GPU of CPU nodes."""
    big = c.submit("BIG", 7, 7, 7)
    j = c.state(big, "queued")
    if "can never fit" not in j["waiting"] or "could hold 6" not in j["waiting"]:
        fail(f"BIG waits saying {j['waiting']!r}: expected that it can never fit (6 workers)")
    gpu = c.submit("GPU", 1, 1, 1, rank_resources="cpu=1,gpu=1")
    jg = c.state(gpu, "queued")
    if "can never fit" not in jg["waiting"] or "gpu=1" not in jg["waiting"]:
        fail(f"GPU waits saying {jg['waiting']!r}: expected that its gpu=1 ranks never fit")
    ref = reference(c)
    a = c.submit("A", 2, 2, 2)
    check_crc(c, [a], ref)
    for q in (big, gpu):
        if c.job(q)["state"] != "queued":
            fail(f"{q} should still be queued: {c.job(q)}")
        c.troupe("job", "stop", q, "--head", c.head)
        c.state(q, "stopped")
    print(f"BIG queued: {j['waiting']}; GPU queued: {jg['waiting']}; A ran meanwhile")


def kill(c):
    """A kill -9 of a worker of job A: A recovers, B (on the same cluster) is untouched, and a
    queued job C does not take the restarted worker from A (a running job gets its min back
    first), then runs when A and B are done."""
    ref = reference(c, LONG)
    a = c.submit("A", 3, 3, 3, steps=LONG)
    b = c.submit("B", 3, 3, 3, steps=LONG)
    c.wait_step(a, 5)
    c.wait_step(b, 5)
    q = c.submit("C", 3, 3, 3, steps=LONG)
    c.state(q, "queued")
    victim = sorted(c.ranks("A"))[0]
    os.kill(c.worker_pid(victim), signal.SIGKILL)
    ra, rb = c.finish(a)["report"], c.finish(b)["report"]
    if ra["generations"] < 2:
        fail(f"A went through {ra['generations']} generation(s) after its worker {victim} was "
             f"killed: expected a recovery")
    if rb["generations"] != 1 or rb["steps_lost"] != 0:
        fail(f"B was touched by A's kill: {rb['generations']} generations, "
             f"{rb['steps_lost']} steps lost")
    check_crc(c, [a, b, q], ref)
    print(f"killed A's {victim}: A recovered ({ra['generations']} generations, world "
          f"{ra['final_world']}); B untouched; C ran after; all crc32c {ref}")


CASES = {"share": share, "queue": queue, "grow": grow, "priority": priority,
         "never_fits": never_fits, "kill": kill}


def main():
    case, binary = sys.argv[1], os.path.abspath(sys.argv[2])
    fail_before(270)  # CTest's TIMEOUT is 300 s (CMakeLists.txt)
    tmp = tempfile.mkdtemp(prefix="troupe-sched-")
    c = Cluster(binary, tmp)
    ok = False
    try:
        t0 = time.time()
        CASES[case](c)
        ok = True
        print(f"SchedulingTest.{case}: passed in {time.time() - t0:.1f}s")
    finally:
        signal.alarm(0)
        if not ok:
            print(c.logs(), file=sys.stderr)
        c.close()
        left = c.leftovers()
        subprocess.run(["rm", "-rf", tmp])
        if left:
            fail(f"processes left behind:\n{left}")


if __name__ == "__main__":
    main()
