"""A cluster of this machine's `troupe` processes for the Python tests of real processes
(ops_test.py, ../scheduling/scheduling_test.py): a head with its HTTP server, the node agents a
test starts, the commands it runs, and the check that nothing is left behind."""
import json
import os
import signal
import subprocess
import time
import urllib.request


def fail(msg):
    raise AssertionError(msg)


def run(cmd, timeout=60, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        fail(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def wait_for(what, pred, timeout=60, every=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    fail(f"timed out after {timeout}s waiting for {what}")


def fail_before(seconds):
    """Fails the test (an AssertionError wherever it is waiting) `seconds` from now: set under
    CTest's TIMEOUT, so a test stuck in a long wait still prints its failure dump (CTest's kill
    prints nothing of the cluster)."""
    def expired(_signum, _frame):
        fail(f"the test's own deadline of {seconds}s passed (CTest's TIMEOUT is near)")
    signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)


class ProcessCluster:
    """A head of `binary` on loopback (its port and HTTP port picked by it), logs under `tmp`;
    node(...) starts an agent; close() kills every process it started."""

    def __init__(self, binary, tmp):
        self.binary, self.tmp, self.procs = binary, tmp, []
        self.logs_dir = os.path.join(tmp, "logs")
        os.makedirs(self.logs_dir)
        self.start("head", ["head", "--port", "0", "--port_file", f"{tmp}/head.port",
                            "--http_port", "0", "--http_port_file", f"{tmp}/head.http",
                            "--log_dir", self.logs_dir])
        port = wait_for("the head's port", lambda: self.read(f"{tmp}/head.port"), 20)
        self.http = int(wait_for("the head's HTTP port", lambda: self.read(f"{tmp}/head.http")))
        self.head = f"127.0.0.1:{port}"

    def node(self, name, workers, *flags):
        self.start(name, ["node", "--head", self.head, "--name", name, "--workers", str(workers),
                          *flags, "--log_dir", self.logs_dir])

    def wait_workers(self, n):
        self.troupe("status", "--head", self.head, "--wait_workers", str(n), "--timeout", "30s")

    @staticmethod
    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return ""

    def start(self, name, args):
        out = open(os.path.join(self.tmp, f"{name}.log"), "w")
        self.procs.append(subprocess.Popen([self.binary] + args, stdout=out, stderr=out,
                                           start_new_session=True))

    def troupe(self, *args, timeout=60, check=True):
        return run([self.binary] + list(args), timeout=timeout, check=check)

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}{path}", timeout=10) as r:
            return r.read().decode()

    def job(self, job_id):
        return json.loads(self.get(f"/api/jobs/{job_id}"))

    def wait_step(self, job_id, step, timeout=120, every=0.2):
        """The job's record once it committed `step` (or succeeded); fails if it failed."""
        def reached():
            j = self.job(job_id)
            if j["state"] in ("failed", "stopped"):
                fail(f"job {job_id} {j['state']}: {j['error']}\n{self.logs()}")
            return j if j["step"] >= step or j["state"] == "succeeded" else None
        return wait_for(f"{job_id} at step {step}", reached, timeout, every)

    def finish(self, job_id):
        """`troupe job wait` until the job ends; its record (fails unless it succeeded)."""
        r = self.troupe("job", "wait", job_id, "--head", self.head, "--timeout", "180s",
                        timeout=200, check=False)
        if r.returncode != 0:
            fail(f"job wait {job_id} exited {r.returncode}:\n{r.stdout}{r.stderr}\n{self.logs()}")
        return self.job(job_id)

    def stop(self, job_id):
        """`troupe job stop`, then its record once it reads stopped."""
        self.troupe("job", "stop", job_id, "--head", self.head)
        wait_for(f"{job_id} stopped", lambda: self.job(job_id)["state"] == "stopped", 30, 0.2)
        return self.job(job_id)

    def logs(self, tail=3000):
        """Every log's tail (a job's events.log too: where a job stopped making progress), then
        what the head says of its cluster (which worker hosts which actor) and its jobs."""
        out = ""
        for root, _, files in os.walk(self.tmp):
            for f in sorted(files):
                if f.endswith((".log", ".err", ".out")):
                    p = os.path.join(root, f)
                    out += f"--- {p}\n" + open(p, errors="replace").read()[-tail:]
        for path in ("/api/cluster", "/api/jobs"):
            try:
                out += f"--- {path}\n" + self.get(path)[-2 * tail:] + "\n"
            except OSError as e:
                out += f"--- {path}: {e}\n"
        return out

    def close(self):
        # The agents' workers and job drivers die with them (PR_SET_PDEATHSIG).
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        deadline = time.time() + 10
        while self.leftovers() and time.time() < deadline:
            time.sleep(0.1)

    def leftovers(self):
        return subprocess.run(["pgrep", "-f", self.tmp], capture_output=True, text=True).stdout
