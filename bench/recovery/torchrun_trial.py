#!/usr/bin/python3
"""One torchrun recovery trial: kill -9 one worker of 4, time until the job commits again.

1. Start torchrun (torchrun_launch.py, its best local configuration: --nnodes=1:1
   --nproc_per_node=4 --max_restarts=3 --monitor_interval=0.5, c10d rendezvous on a free
   loopback port) running torchrun_job.py for --steps steps, in a session of its own.
2. Follow the job's commit log until step --kill-at has committed.
3. kill -9 the worker with RANK=1 (never rank 0, so the writer of checkpoints and of the log
   is always among the killed group's survivors; any fixed choice would do, since torchrun
   restarts the whole group either way). Workers are found as children of the torchrun agent
   (/proc/<agent>/task/*/children), their rank read from /proc/<pid>/environ.
4. Wait for the first commit written by the restarted group (restart count > 0).
   recovery_s = its time − the kill time (both time.time() on this machine).
   steps_lost = (highest step the first group committed + 1) − (first step the restarted
   group committed), clipped at 0: committed steps that had to be computed again. The step
   that was in flight at the kill is not counted (it never committed); with a checkpoint
   every step the expected value is 0. A commit the first group still writes after the kill
   (its in-flight step finishing) counts as committed work, not as recovery.
5. Kill the whole process group (SIGTERM, then SIGKILL), sweep any process still carrying
   this trial's marker in its environment, and remove the trial's folder.

Prints one line: torchrun_trial recovery_s=<x> steps_lost=<n>
Usage: torchrun_trial.py [--steps 40] [--kill-at 10] [--timeout 120] [--keep DIR]
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"  # Debian's python3-torch works only with the system interpreter
OPENBLAS_DIR = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
MARKER = "COMPARE_RECOVERY_TRIAL"  # set in the agent's environment, inherited by every worker
LINE = re.compile(r"^(commit|start) (.*)$")


class TrialError(RuntimeError):
    pass


def openblas_core_type():
    """The OpenBLAS core type troupe's GEMM names for this CPU (kernels/matmul.cc, CoreForThisCpu):
    by instruction set, since Debian 12's OpenBLAS (0.3.21) takes CPUs newer than itself for a
    Prescott and runs SSE3 kernels 3-5x slower (an Emerald Rapids here). None: OpenBLAS's own
    detection, as troupe leaves it."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"avx512f", "avx512cd", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def torch_env():
    """Environment for torch processes: OpenBLAS first when installed (see docs/STACK.md), with the
    kernels troupe's side runs (OPENBLAS_CORETYPE, unless the caller set it)."""
    env = dict(os.environ)
    if os.path.isdir(OPENBLAS_DIR) and OPENBLAS_DIR not in env.get("LD_LIBRARY_PATH", ""):
        env["LD_LIBRARY_PATH"] = OPENBLAS_DIR + (":" + env["LD_LIBRARY_PATH"]
                                                 if env.get("LD_LIBRARY_PATH") else "")
    core = openblas_core_type()
    if core is not None and "OPENBLAS_CORETYPE" not in env:
        env["OPENBLAS_CORETYPE"] = core
    return env


def check_torch(caller):
    """Exits 2 unless Debian's python3-torch imports; prints the version and the BLAS it loads."""
    probe = ("import os, re, torch; torch.ones(8, 8) @ torch.ones(8, 8)\n"
             "libs = {os.path.realpath(l.split()[-1]) for l in open('/proc/self/maps') if '/' in l}\n"
             "blas = sorted(p for p in libs if re.search(r'blas|lapack|mkl', os.path.basename(p)))\n"
             "import ctypes\n"
             "core = ''\n"
             "for p in blas:\n"
             "    try:\n"
             "        f = ctypes.CDLL(p).openblas_get_corename\n"
             "    except (OSError, AttributeError):\n"
             "        continue\n"
             "    f.restype = ctypes.c_char_p\n"
             "    core = '(OpenBLAS core ' + f().decode() + ')'\n"
             "    break\n"
             "print(torch.__version__, ', '.join(blas) or 'no BLAS library found', core)")
    r = subprocess.run([PYTHON, "-c", probe], env=torch_env(),
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{caller}: `{PYTHON} -c 'import torch'` failed:\n"
              f"{r.stderr.strip()[-500:]}\n"
              "The torchrun peer needs Debian's PyTorch for the system Python: "
              "apt-get install -y python3-torch", file=sys.stderr)
        sys.exit(2)
    version, blas = r.stdout.strip().split(" ", 1)
    return version, blas


def ensure_torch(caller):
    """Installs Debian's python3-torch (the peer) when missing, then check_torch(caller)."""
    if subprocess.run(["dpkg", "-s", "python3-torch"], capture_output=True).returncode != 0:
        print("== installing python3-torch (the peer)", flush=True)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "python3-torch"],
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), check=True,
                       stdout=subprocess.DEVNULL)
    return check_torch(caller)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return kids


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


def marked_pids(marker_value):
    """Every live process started by this trial (they all inherit the marker)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and environ_of(int(name)).get(MARKER) == marker_value:
            pids.append(int(name))
    return pids


class LineTail:
    """The complete lines appended to a file since the last call (an unfinished last line waits
    for the next one; a missing file has none yet)."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, ""

    def new_lines(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        lines = (self.partial + data).split("\n")
        self.partial = lines.pop()
        return lines


class CommitLog:
    """Reads the job's log incrementally; keeps every parsed record."""

    def __init__(self, path):
        self.path, self.tail, self.records = path, LineTail(path), []

    def poll(self):
        new = []
        for line in self.tail.new_lines():
            m = LINE.match(line)
            if m:
                rec = {"kind": m.group(1)}
                rec.update(kv.split("=", 1) for kv in m.group(2).split())
                rec["step"] = int(rec.get("step", rec.get("resume_step", 0)))
                rec["restart"], rec["t"] = int(rec["restart"]), float(rec["t"])
                new.append(rec)
        self.records += new
        return new


def run_trial(steps=40, kill_at=10, timeout=120.0, poll_s=0.01, keep=None):
    """Runs one trial; returns a dict with recovery_s, steps_lost and timing details."""
    if not 0 < kill_at < steps:
        raise ValueError("need 0 < kill_at < steps")
    work = keep or tempfile.mkdtemp(prefix="compare-recovery-torchrun.")
    os.makedirs(work, exist_ok=True)
    if os.listdir(work):
        raise TrialError(f"{work} is not empty (a checkpoint there would be resumed)")
    commit_log, out_path = os.path.join(work, "commits.log"), os.path.join(work, "torchrun.out")
    marker = uuid.uuid4().hex
    env = torch_env()
    env[MARKER] = marker
    cmd = [PYTHON, os.path.join(HERE, "torchrun_launch.py"),
           "--nnodes=1:1", "--nproc_per_node=4", "--max_restarts=3", "--monitor_interval=0.5",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}",
           os.path.join(HERE, "torchrun_job.py"),
           "--steps", str(steps), "--ckpt-dir", work, "--commit-log", commit_log]
    log = CommitLog(commit_log)
    with open(out_path, "wb") as out:
        agent = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout

    def wait_for(pred, what):
        while time.monotonic() < deadline:
            for rec in log.poll():
                if pred(rec):
                    return rec
            if agent.poll() is not None:
                raise TrialError(f"torchrun exited (rc={agent.returncode}) before {what}")
            time.sleep(poll_s)
        raise TrialError(f"timed out after {timeout:.0f} s waiting for {what}")

    try:
        wait_for(lambda r: r["kind"] == "commit" and r["step"] >= kill_at,
                 f"step {kill_at} to commit")
        victims = [pid for pid in children(agent.pid) if environ_of(pid).get("RANK") == "1"]
        if len(victims) != 1:
            raise TrialError(f"expected one worker with RANK=1 under the agent, found {victims}")
        kill_t = time.time()
        os.kill(victims[0], signal.SIGKILL)
        first = wait_for(lambda r: r["kind"] == "commit" and r["restart"] > 0,
                         "the first commit after the kill")
        restart_start = next(r for r in log.records if r["kind"] == "start" and r["restart"] > 0)
        old = [r["step"] for r in log.records if r["kind"] == "commit" and r["restart"] == 0]
        before = [r["step"] for r in log.records
                  if r["kind"] == "commit" and r["restart"] == 0 and r["t"] <= kill_t]
        result = {
            "recovery_s": first["t"] - kill_t,
            "steps_lost": max(0, max(old) + 1 - first["step"]),
            # Details: when the restarted group's rank 0 was up, which steps bracket the kill.
            "restart_up_s": restart_start["t"] - kill_t,
            "last_commit_before_kill": max(before),
            "last_commit_first_group": max(old),
            "first_commit_after": first["step"],
        }
    except Exception:
        with open(out_path, errors="replace") as f:
            tail = f.read()[-3000:]
        sys.stderr.write(f"--- torchrun output (last 3000 characters):\n{tail}\n")
        raise
    finally:
        stop_group(agent, marker)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return result


def stop_group(agent, marker):
    """Ends the agent's process group, then anything else that carries the trial's marker."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(agent.pid, sig)
        except ProcessLookupError:
            pass
        end = time.monotonic() + grace
        while time.monotonic() < end and (agent.poll() is None or marked_pids(marker)):
            time.sleep(0.05)
        if agent.poll() is not None and not marked_pids(marker):
            return
    for pid in marked_pids(marker):  # left its group somehow: last resort
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    agent.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kill-at", type=int, default=10)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--keep", help="keep the trial's files (checkpoint, logs) in this folder")
    a = p.parse_args()
    try:
        r = run_trial(a.steps, a.kill_at, a.timeout, keep=a.keep)
    except TrialError as e:
        print(f"torchrun_trial failed: {e}", file=sys.stderr)
        return 1
    print(f"torchrun_trial recovery_s={r['recovery_s']:.3f} steps_lost={r['steps_lost']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
