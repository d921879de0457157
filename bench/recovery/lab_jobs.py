"""Jobs on a lab of hosts (scripts/lab) for the side-by-side benchmarks (bench/compare-multihost,
bench/compare-lowcomm): processes started inside lab hosts and found again by a marker in their
environment, commit logs polled for the time each step appeared, and each side's job: `troupe
train --head` on a cluster of node agents, and torchrun agents running DDP over Gloo
(torchrun_job.py). Standard library only; torch runs in the processes it starts.
"""
import itertools
import os
import re
import shlex
import subprocess
import time
import uuid

import torchrun_trial as tt

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LAB_SCRIPT = os.path.join(ROOT, "scripts", "lab")
TROUPE = os.path.join(ROOT, "build", "tools", "troupe")
MARKER = "TROUPE_LAB_BENCH"  # in the environment of every process a job starts in the lab
RDZV_PORTS = itertools.count(29400)  # one per torch job: no store waits out an old one


class BenchError(RuntimeError):
    pass


def ip(host):
    return f"10.77.{host}.2"


class Lab:
    """scripts/lab for lab `name`; hosts are numbered 1..N as the script names them."""

    def __init__(self, name):
        self.name = name

    def host(self, h):
        return f"{self.name}-h{h}"

    def __call__(self, *args):
        r = subprocess.run([LAB_SCRIPT, *map(str, args)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BenchError(f"scripts/lab {' '.join(map(str, args))}: {r.stderr.strip()}")
        return r.stdout

    def up(self, n):
        self("up", n, "--name", self.name)
        return f"/var/tmp/troupe-lab/{self.name}/shared"

    def down(self):
        self("down", "--name", self.name)

    def run_on(self, h, *cmd):
        return self("exec", self.host(h), *cmd)

    def start_on(self, h, cmd, log, marker, env=None):
        """Starts cmd inside host h (its own process group), output appended to log."""
        e = dict(env or os.environ)
        e[MARKER] = marker
        with open(log, "ab") as out:
            return subprocess.Popen([LAB_SCRIPT, "exec", self.host(h), *cmd], env=e, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def rtt_ms(self, a, b):
        """Mean round trip of 20 pings from host a to host b."""
        out = self.run_on(a, "ping", "-c", "20", "-i", "0.02", "-q", ip(b))
        m = re.search(r"= [0-9.]+/([0-9.]+)/", out)
        if not m:
            raise BenchError(f"no RTT in ping's output: {out}")
        return float(m.group(1))

    def tx_bytes(self, hosts):
        """Bytes the hosts have sent on eth0, summed (their namespaces' counters)."""
        return sum(int(self.run_on(h, "cat", "/sys/class/net/eth0/statistics/tx_bytes"))
                   for h in hosts)


def marked(marker):
    return [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
            if tt.environ_of(p).get(MARKER) == marker]


def kill_marked(marker):
    """SIGKILLs every process carrying the marker until none is left (5 s at most)."""
    end = time.monotonic() + 5
    while (pids := marked(marker)) and time.monotonic() < end:
        for p in pids:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    if pids:
        raise BenchError(f"processes {pids} survived SIGKILL")


class Commits:
    """Polls a commit log; records the time (this machine's clock) each step's line appeared."""

    def __init__(self, path, parse):
        self.path, self.parse, self.tail, self.seen = path, parse, tt.LineTail(path), {}

    def poll(self):
        lines = self.tail.new_lines()
        now = time.monotonic()
        for line in lines:
            step = self.parse(line)
            if step is not None:
                self.seen.setdefault(step, now)

    def wait(self, step, procs, timeout, what):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.poll()
            if step in self.seen:
                return
            for p in procs:
                if p.poll() is not None and p.returncode != 0:
                    raise BenchError(f"{what}: {shlex.join(p.args)} exited {p.returncode}")
            time.sleep(0.002)
        raise BenchError(f"{what}: step {step} not committed within {timeout:.0f} s")

    def tokens_per_s(self, tokens_per_step, first, last):
        return tokens_per_step * (last - first) / (self.seen[last] - self.seen[first])


def troupe_commit(line):  # commits.log: "<step index> <generation>", step index = step - 1
    parts = line.split()
    return int(parts[0]) + 1 if len(parts) == 2 else None


def torch_commit(line):  # "commit step=<n> t=... restart=<k> ..."
    m = re.match(r"commit step=(\d+) ", line)
    return int(m.group(1)) if m else None


class Run:
    """One job on the lab: its folder on the shared directory, its processes, its marker."""

    def __init__(self, lab, shared, name):
        self.lab, self.name, self.dir = lab, name, os.path.join(shared, name)
        os.makedirs(self.dir)
        self.marker = uuid.uuid4().hex
        self.procs = []

    def start(self, host, cmd, log, env=None):
        p = self.lab.start_on(host, cmd, os.path.join(self.dir, log), self.marker, env)
        self.procs.append(p)
        return p

    def stop(self):
        kill_marked(self.marker)
        for p in self.procs:
            p.wait()

    def log_tail(self):
        out = []
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if name.endswith(".txt") and os.path.isfile(path):
                with open(path, errors="replace") as f:
                    out.append(f"--- {path}\n{f.read()[-1500:]}")
        return "\n".join(out)


def troupe_job(lab, shared, name, workers, head_host, spec, watch, timeout, extra=(),
               labels=None):
    """Runs `troupe train --head` on a fresh cluster: the head and the driver on head_host, a node
    agent with one worker on each of `workers` (labels[h]: its --labels). `spec` is the job spec
    with {dir} for the run's folder; watch(commits, driver) runs while it trains. Returns
    (commits, the report's text, what watch returned, the run's folder)."""
    run = Run(lab, shared, name)
    try:
        head = f"{ip(head_host)}:7000"
        run.start(head_host, [TROUPE, "head", "--host", ip(head_host), "--port", "7000"],
                  "head.txt")
        for h in workers:
            more = ["--labels", labels[h]] if labels and labels.get(h) else []
            run.start(h, [TROUPE, "node", "--head", head, "--name", lab.host(h), "--workers", "1",
                          "--log_dir", run.dir, *more], f"node-h{h}.txt")
        status = run.start(head_host, [TROUPE, "status", "--head", head, "--wait_workers",
                                       str(len(workers))], "status.txt")
        if status.wait(timeout) != 0:
            raise BenchError(f"{name}: the cluster did not reach {len(workers)} workers")
        path = os.path.join(run.dir, "job.toml")
        with open(path, "w") as f:
            f.write(spec.replace("{dir}", run.dir))
        report = os.path.join(run.dir, "report")
        driver = run.start(head_host, [TROUPE, "train", "--head", head, "--spec", path, "--report",
                                       report, *extra], "train.txt")
        commits = Commits(os.path.join(run.dir, "job", "commits.log"), troupe_commit)
        watched = watch(commits, driver)
        if driver.wait(timeout) != 0:
            raise BenchError(f"troupe {name}: `troupe train` exited {driver.returncode}")
        with open(report) as f:
            return commits, f.read(), watched, run.dir
    except BenchError as e:
        raise BenchError(f"{e}\n{run.log_tail()}") from None
    finally:
        run.stop()


def torch_job(lab, shared, name, workers, args, watch):
    """Runs torchrun_job.py under one torchrun agent per host of `workers` (--nproc_per_node=1,
    c10d rendezvous on the first), DDP over Gloo on eth0 with 1 thread a rank; `args` are the job's
    (--steps, --size, ...; the commit log is the run's). watch(run, commits) runs while it trains;
    returns what watch returned."""
    run = Run(lab, shared, name)
    try:
        env = tt.torch_env()
        env.update(GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        log = os.path.join(run.dir, "commits.log")
        port = next(RDZV_PORTS)
        for h in workers:
            run.start(h, [tt.PYTHON, os.path.join(HERE, "torchrun_launch.py"),
                          f"--nnodes={len(workers)}", "--nproc_per_node=1", "--max_restarts=3",
                          "--monitor_interval=0.5", "--rdzv_backend=c10d",
                          f"--rdzv_endpoint={ip(workers[0])}:{port}", f"--rdzv_id={name}",
                          os.path.join(HERE, "torchrun_job.py"), *args, "--ckpt-dir", run.dir,
                          "--commit-log", log], f"agent-h{h}.txt", env)
        return watch(run, Commits(log, torch_commit))
    except BenchError as e:
        raise BenchError(f"{e}\n{run.log_tail()}") from None
    finally:
        run.stop()
