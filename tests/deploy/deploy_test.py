#!/usr/bin/python3
"""DeployTest: deploy/ checked without a cluster or a container engine, and the SLURM script on a
real SLURM.

  deploy_test.py CASE SOURCE_DIR [TROUPE_BINARY]
CASE: kubernetes (the manifests against Kubernetes' schemas, kubernetes-validate --strict, and
the settings the manifests promise; each pod's init container's certificate command run with
TROUPE_BINARY and its certificate checked with openssl), dockerfile (hadolint). The validators come
from PyPI into /opt/troupe/deploy-tools (scripts/setup); a missing one fails the test, naming it.
The SLURM cases run deploy/slurm/troupe.sbatch with `sbatch --nodes=3` on Debian's slurm-wlm:
slurmctld, munged and a slurmd on each of 3 lab hosts (tests/deploy/slurm_lab.sh, scripts/lab;
each host its own node, whose own name resolves to 127.0.1.1 as on Debian), and compare each
job's final CRC with that of the same spec trained uninterrupted by `troupe train`:
  slurm_job     a fault-free job completes to its CRC and ends in order (the agents leave, then
                the head; no step cancelled); a head that cannot listen fails its job;
  slurm_drain   `scancel --signal=TERM --full` at step 10: the job checkpoints and ends
                preempted, the script requeues it, the requeued run resumes from that checkpoint
                to the CRC;
  slurm_shared  two jobs at once on the same nodes (one with 2 workers per node: 6 ranks), each
                on its own head's port, both to their CRCs.
After each, nothing of the lab remains: no process, namespace or SLURM state.
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TOOLS = os.environ.get("TROUPE_DEPLOY_TOOLS", "/opt/troupe/deploy-tools")


def fail(msg):
    print(f"DeployTest: {msg}", file=sys.stderr)
    sys.exit(1)


def tool(name):
    path = os.path.join(TOOLS, "bin", name)
    if not os.access(path, os.X_OK):
        fail(f"{path} not found: run scripts/setup (it installs the PyPI validators there)")
    return path


def run(cmd, env=None, timeout=120, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, **kw)


def kubernetes(src, binary):
    files = sorted(os.path.join(src, "deploy/kubernetes", f)
                   for f in os.listdir(os.path.join(src, "deploy/kubernetes")) if f.endswith(".yaml"))
    if len(files) < 3:
        fail(f"expected the head, nodes and network policy manifests, got {files}")
    env = dict(os.environ, PYTHONPATH=TOOLS)
    r = run([sys.executable, tool("kubernetes-validate"), "--strict", "--no-warn"] + files, env=env)
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        fail("kubernetes-validate rejected the manifests")
    sys.path.insert(0, TOOLS)
    import yaml  # noqa: E402  (PyYAML comes with kubernetes-validate)
    docs = {}
    for f in files:
        for d in yaml.safe_load_all(open(f)):
            docs[(d["kind"], d["metadata"]["name"])] = d
    ds = docs[("DaemonSet", "troupe-node")]["spec"]["template"]["spec"]
    node = ds["containers"][0]
    args = node["args"]
    grace = int(args[args.index("--grace") + 1].rstrip("s"))
    if not grace < ds["terminationGracePeriodSeconds"]:
        fail(f"the node's --grace {grace}s must end inside terminationGracePeriodSeconds "
             f"{ds['terminationGracePeriodSeconds']}")
    if "preStop" not in node.get("lifecycle", {}):
        fail("the node agent has no preStop hook")
    if args[args.index("--head") + 1] != "troupe-head:7000":
        fail("the node agents do not reach the head through its Service")
    svc = docs[("Service", "troupe-head")]["spec"]
    dep = docs[("Deployment", "troupe-head")]["spec"]
    labels = dep["template"]["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in svc["selector"].items()):
        fail("the head's Service does not select the head's pods")
    head_args = dep["template"]["spec"]["containers"][0]["args"]
    if "--store" not in head_args:
        fail("the head has no store: a restarted head would lose the membership")
    http = head_args[head_args.index("--http_port") + 1] if "--http_port" in head_args else None
    notes = dep["template"]["metadata"].get("annotations", {})
    if (notes.get("prometheus.io/scrape") != "true" or notes.get("prometheus.io/port") != http
            or notes.get("prometheus.io/path") != "/metrics"):
        fail(f"the head's pod is not annotated for scraping /metrics on --http_port {http}: {notes}")
    if not any(str(p["port"]) == http for p in svc["ports"]):
        fail(f"the head's Service does not expose --http_port {http}")
    for kind, name, member in (("Deployment", "troupe-head", "head"),
                               ("DaemonSet", "troupe-node", "node")):
        pod = docs[(kind, name)]["spec"]["template"]["spec"]
        certificates(pod, member, binary)
    print("kubernetes: schemas and settings hold")


def certificates(pod, member, binary):
    """The pod's init container issues its certificate from the Secret troupe-ca; the main
    container reads it (TROUPE_TLS_*). The init container's own command is run here, with the
    real binary, and the certificate checked with openssl."""
    init = pod.get("initContainers", [{}])[0]
    args = init.get("args", [])
    if args[:1] != ["certs"] or "--ca" not in args:
        fail(f"{member}: no init container issuing the pod's certificate: {init}")
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    ca_dir, tls_dir = args[args.index("--ca") + 1], args[args.index("--dir") + 1]
    if vols.get(mounts.get(ca_dir), {}).get("secret", {}).get("secretName") != "troupe-ca":
        fail(f"{member}: --ca {ca_dir} is not the Secret troupe-ca")
    env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
    if env.get("TROUPE_TLS_CERT") != f"{tls_dir}/{member}.pem" or \
            env.get("TROUPE_TLS_CA") != f"{tls_dir}/ca.pem":
        fail(f"{member}: the container does not use the issued certificate: {env}")
    with tempfile.TemporaryDirectory(prefix="troupe-deploy-certs.") as d:
        run([binary, "certs", "--dir", f"{d}/secret", "--members", "operator"])
        members = args[args.index("--members") + 1].replace("$(POD_IP)", "10.1.2.3")
        r = run([binary] + [a.replace(ca_dir, f"{d}/secret").replace(tls_dir, f"{d}/tls")
                            .replace("$(POD_IP)", "10.1.2.3") for a in args])
        if r.returncode != 0:
            fail(f"{member}: the init container's command failed: {r.stdout}{r.stderr}")
        if os.path.exists(f"{d}/tls/ca.key"):
            fail(f"{member}: the CA's key was copied into the pod's certificates")
        v = run(["openssl", "verify", "-CAfile", f"{d}/tls/ca.pem", f"{d}/tls/{member}.pem"])
        san = run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                   f"{d}/tls/{member}.pem"]).stdout
        if v.returncode != 0 or "IP Address:10.1.2.3" not in san or \
                ("head" in member and "DNS:troupe-head" not in san):
            fail(f"{member} ({members}): {v.stdout}{v.stderr} {san}")
    print(f"{member}: its init container issues a certificate of the Secret's CA naming {san.split(chr(10))[1].strip()}")


def dockerfile(src):
    df = os.path.join(src, "deploy/Dockerfile")
    r = run([tool("hadolint"), "--config", os.path.join(src, "deploy/hadolint.yaml"), df])
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        fail("hadolint rejected deploy/Dockerfile")
    text = open(df).read()
    if "COPY --from=build /src/build/tools/troupe /usr/local/bin/troupe" not in text:
        fail("the run stage does not take the built binary")
    if not re.search(r'^ENTRYPOINT \["/usr/local/bin/troupe"\]', text, re.M):
        fail("the image's entry point is not troupe")
    print("dockerfile: hadolint clean")


# --- SLURM: the shipped batch script on a real SLURM of lab hosts ------------------------------

LAB_ROOT = "/var/tmp/troupe-lab"
# The lab's nodes share this machine's 2 cores with each other (and with other tests): an agent
# starved for over the default 1 s of heartbeats is declared dead, and a job whose driver's node
# dies fails. Not what these cases test: the head waits 5 s.
HEARTBEAT_TIMEOUT = "5s"
DRAIN_STEP = 10
SPEC = """[job]
name = "{name}"
steps = {steps}
seed = {seed}
work_dir = "work"
[model]
microbatches = {microbatches}
[elastic]
min_workers = 1
max_workers = 6
[checkpoint]
every = {every}
"""


def lab_name():
    """trlab + the pid in base 36 (4 digits): one lab per test process."""
    n, tail = os.getpid(), ""
    for _ in range(4):
        n, r = divmod(n, 36)
        tail = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + tail
    return "trlab" + tail


class Reference:
    """The spec trained uninterrupted by `troupe train` on an embedded cluster of 2 workers, outside
    the lab and before the SLURM jobs (not to starve them): deterministic mode gives the same
    weights for any world size, so its CRC is the one the SLURM job must end with."""

    def __init__(self, binary, spec):
        self.tmp = tempfile.mkdtemp(prefix="troupe-deploy-ref.")
        os.makedirs(f"{self.tmp}/tmp")
        self.log = open(f"{self.tmp}/train.log", "w")
        self.proc = subprocess.Popen(
            [binary, "train", "--spec", spec, "--work_dir", f"{self.tmp}/work", "--workers", "2",
             "--report", f"{self.tmp}/report"], stdout=self.log, stderr=subprocess.STDOUT,
            env=dict(os.environ, TMPDIR=f"{self.tmp}/tmp"), start_new_session=True)

    def crc(self):
        try:
            rc = self.proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        report = open(f"{self.tmp}/report").read() if os.path.exists(f"{self.tmp}/report") else ""
        m = re.search(r"crc32c=([0-9a-f]{8})", report)
        if rc != 0 or not m:
            fail(f"the reference `troupe train` exited {rc}:\n{open(self.log.name).read()[-3000:]}")
        return m.group(1)

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class SlurmLab:
    """tests/deploy/slurm_lab.sh's cluster: slurmctld, munged and a slurmd on each of 3 lab
    hosts."""

    def __init__(self, src, binary, cpus=6):
        self.src, self.binary, self.cpus, self.name = src, binary, cpus, lab_name()
        self.script = os.path.join(src, "tests/deploy/slurm_lab.sh")
        self.shared = f"{LAB_ROOT}/{self.name}/shared"
        self.troupe = f"{self.shared}/bin/troupe"
        self.env = dict(os.environ, SLURM_CONF=f"{self.shared}/slurm/slurm.conf")
        self.refs = []

    def up(self):
        t0 = time.time()
        r = run([self.script, "up", "--name", self.name, "--cpus", str(self.cpus)], timeout=120)
        print(r.stdout + r.stderr, end="")
        if r.returncode != 0:
            fail("slurm_lab.sh up failed")
        # Each host has a /tmp of its own: the binary goes where they all see it.
        os.makedirs(os.path.dirname(self.troupe))
        shutil.copy2(self.binary, self.troupe)
        print(f"slurm lab {self.name} up in {time.time() - t0:.1f}s")

    def down(self):
        for ref in self.refs:
            ref.close()
        r = run([self.script, "down", "--name", self.name], timeout=180)
        print(r.stdout + r.stderr, end="")
        left = ""
        if r.returncode != 0:
            left += "slurm_lab.sh down failed (above)\n"
        procs = run(["pgrep", "-a", "-f", f"{LAB_ROOT}/{self.name}/"]).stdout
        if procs:
            left += f"processes:\n{procs}"
        ns = [n for n in run(["ip", "netns", "list"]).stdout.split()
              if n.startswith(self.name + "-")]
        if ns:
            left += f"network namespaces: {ns}\n"
        for d in (f"{LAB_ROOT}/{self.name}", f"/run/troupe-lab/{self.name}"):
            if os.path.exists(d):
                left += f"{d} (the SLURM state)\n"
        if left:
            fail(f"left behind by lab {self.name}:\n{left}")

    def keep(self):
        """Copies the jobs' directories and SLURM's logs out of the lab (which `down` removes)."""
        dest = tempfile.mkdtemp(prefix=f"troupe-deploy-{self.name}.")
        shutil.copytree(self.shared, f"{dest}/shared", symlinks=True,
                        ignore=shutil.ignore_patterns("bin", "run", "munge", "spool", "state"))
        print(f"the lab's files are kept in {dest}")

    def reference(self, d):
        ref = Reference(self.binary, f"{d}/job.toml")
        self.refs.append(ref)
        return ref

    def on(self, host, *cmd, cwd=None, env=None, timeout=60):
        return run([os.path.join(self.src, "scripts/lab"), "exec", f"{self.name}-{host}", *cmd],
                   env=env or self.env, cwd=cwd, timeout=timeout)

    def job_dir(self, name, steps, seed=1, microbatches=4, every=5):
        d = f"{self.shared}/{name}"
        os.makedirs(d)
        with open(f"{d}/job.toml", "w") as f:
            f.write(SPEC.format(name=name, steps=steps, seed=seed, microbatches=microbatches,
                                every=every))
        return d

    def sbatch(self, d, *args, env=None):
        """sbatch of deploy/slurm/troupe.sbatch job.toml from d on the first host; the job id."""
        e = dict(self.env, TROUPE=self.troupe,
                 TROUPE_HEARTBEAT_TIMEOUT=HEARTBEAT_TIMEOUT, **(env or {}))
        r = self.on("h1", "sbatch", "--parsable", *args,
                    os.path.join(self.src, "deploy/slurm/troupe.sbatch"), "job.toml", cwd=d, env=e)
        job = r.stdout.strip()
        if r.returncode != 0 or not job.isdigit():
            fail(f"sbatch exited {r.returncode}: {r.stdout}{r.stderr}")
        return job

    def job(self, job):
        """`scontrol show job`'s fields."""
        r = self.on("h1", "scontrol", "--oneliner", "show", "job", job)
        return dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)

    def wait_done(self, job, d, timeout):
        """Waits until SLURM lists the job no more (a requeued one is listed while it waits);
        its fields."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.on("h1", "squeue", "--noheader", "--jobs", job)
            if (r.returncode == 0 and not r.stdout.strip()) or "Invalid job id" in r.stderr:
                return self.job(job)
            time.sleep(0.5)
        fail(f"job {job} still queued or running after {timeout}s:\n{self.logs(job, d)}")

    def files(self, job, d):
        state = f"{d}/troupe-{job}"
        out = {"out": read(f"{d}/slurm-{job}.out")}
        for f in ("head.log", "nodes.log", "job.status", "job.log"):
            out[f] = read(f"{state}/{f}")
        return out

    def logs(self, job, d):
        text = "".join(f"--- {name}\n{body[-4000:]}\n" for name, body in self.files(job, d).items())
        return text + "--- slurmctld.log\n" + read(f"{self.shared}/slurm/log/slurmctld.log")[-3000:]

    def strays(self):
        """Every process on the hosts but the init, SLURM's and munge's daemons."""
        out = ""
        for h in ("h1", "h2", "h3"):
            for line in self.on(h, "ps", "-e", "-o", "pid=,ppid=,args=").stdout.splitlines():
                pid, ppid, args = (line.split(None, 2) + [""])[:3]
                if pid == "1" or args.startswith("ps ") or (ppid == "1" and args == "sleep 3600"):
                    continue
                if re.match(r"(munged|slurmctld|slurmd) |: slurmscriptd", args):
                    continue
                out += f"{self.name}-{h}: {pid} {args}\n"
        return out

    def assert_quiet(self, what):
        """Nothing of the job is left on any host (slurmstepd goes within a few seconds)."""
        deadline = time.time() + 15
        while (left := self.strays()) and time.time() < deadline:
            time.sleep(0.2)
        if left:
            fail(f"after {what}, still running:\n{left}")


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def runs_of(text):
    """A per-run log's runs: {restart count: that run's text}."""
    parts = re.split(r"^=== run (\d+) \(SLURM_RESTART_COUNT=(\d+)\) of job \d+ on \S+, .* ===$",
                     text, flags=re.M)
    runs = {}
    for i in range(1, len(parts) - 2, 3):
        if parts[i] != parts[i + 1]:
            fail(f"a header names run {parts[i]} with SLURM_RESTART_COUNT={parts[i + 1]}")
        runs[int(parts[i])] = parts[i + 2]
    return runs


def check_run(lab, job, d, files, run_no, state, crc=None):
    """Run run_no of the job: a header in each of its files, the head on the first node's
    address, an agent per node on its own address with the node's CPUs, and the job in `state`
    (with `crc`); returns the job's status text of that run."""
    for name in ("head.log", "nodes.log", "job.status", "job.log"):
        if run_no not in runs_of(files[name]):
            fail(f"{name} has no header of run {run_no}:\n{lab.logs(job, d)}")
    head = runs_of(files["head.log"])[run_no]
    if not re.search(r"^troupe head: listening on 10\.77\.1\.2:\d+ ", head, re.M):
        fail(f"run {run_no}: the head does not listen on the first node's address:\n{head}")
    nodes = runs_of(files["nodes.log"])[run_no]
    for i in (1, 2, 3):
        # The first host's own name resolves to 127.0.1.1 there (Debian's /etc/hosts).
        if not re.search(rf"^troupe node {lab.name}-h{i}: joined 10\.77\.1\.2:\d+ with cpu=\d+ "
                         rf"as 10\.77\.{i}\.2,", nodes, re.M):
            fail(f"run {run_no}: no agent of {lab.name}-h{i} joined the head as 10.77.{i}.2:\n"
                 f"{nodes}")
    status = runs_of(files["job.status"])[run_no]
    m = re.search(r"^job-\d+\s+\S+\s+(\w+)$", status, re.M)
    if not m or m.group(1) != state:
        fail(f"run {run_no}: expected the job {state}:\n{lab.logs(job, d)}")
    if crc:
        got = re.search(r"crc32c ([0-9a-f]{8})", status)
        if not got or got.group(1) != crc:
            fail(f"run {run_no}: crc {got and got.group(1)}, the uninterrupted run's {crc}:\n"
                 f"{status}")
    return status


def check_orderly(lab, job, d, files, run_no):
    """The run ended in order: the agents left by themselves (no step cancelled, no task killed by
    SLURM, no agent that lost its head), then the head."""
    nodes = runs_of(files["nodes.log"])[run_no]
    for bad in ("CANCELLED", "srun: error", "lost the head", "forcing job termination"):
        if bad in nodes:
            fail(f"run {run_no} did not end in order ('{bad}'):\n{nodes}")
    if nodes.count(": left") != 3:
        fail(f"run {run_no}: expected 3 agents to leave:\n{nodes}")
    if not re.search(r"^troupe head: stopping on signal 15", runs_of(files["head.log"])[run_no],
                     re.M):
        fail(f"run {run_no}: the head was not stopped at the end:\n{files['head.log']}")


def slurm_case(src, binary, body):
    """Runs body(lab) on a fresh SLURM lab, always removed; then nothing of it may remain."""
    for t in ("slurmctld", "slurmd", "sbatch", "munged"):
        if not shutil.which(t):
            fail(f"'{t}' not found: scripts/setup installs slurmctld, slurmd, slurm-client, munge")
    lab = SlurmLab(src, binary)
    t0, passed = time.time(), False
    try:
        lab.up()
        body(lab)
        passed = True
    finally:
        if os.path.isdir(lab.shared) and (not passed or os.environ.get("TROUPE_KEEP_TEST_DIRS")):
            lab.keep()
        lab.down()
    print(f"slurm case done in {time.time() - t0:.1f}s, lab {lab.name} removed, nothing left")


def slurm_job(src, binary):
    """A fault-free job completes with the uninterrupted run's CRC and ends in order; a head that
    cannot listen fails its job."""
    text = open(os.path.join(src, "deploy/slurm/troupe.sbatch")).read()
    for want in ("#SBATCH --signal=TERM@60", "#SBATCH --requeue", "#SBATCH --cpus-per-task=2"):
        if want not in text:
            fail(f"the script lacks '{want}'")

    def body(lab):
        d = lab.job_dir("ok", steps=20)
        crc = lab.reference(d).crc()
        # The port slurmctld holds on the first node: the head cannot listen, the job fails.
        bad = lab.sbatch(d, "--nodes=3", env={"TROUPE_PORT": "6817"})
        info = lab.wait_done(bad, d, 90)
        out = read(f"{d}/slurm-{bad}.out")
        if info.get("JobState") != "FAILED" or "the head did not listen" not in out:
            fail(f"a head that cannot listen: expected a failed job, got {info.get('JobState')}:\n"
                 f"{lab.logs(bad, d)}")
        lab.assert_quiet("a job whose head could not listen")
        print(f"job {bad}: failed, its head unable to listen on the port slurmctld holds")
        t0 = time.time()
        job = lab.sbatch(d, "--nodes=3")
        info = lab.wait_done(job, d, 150)
        files = lab.files(job, d)
        if info.get("JobState") != "COMPLETED" or info.get("ExitCode") != "0:0":
            fail(f"job {job}: {info.get('JobState')} {info.get('ExitCode')}:\n{lab.logs(job, d)}")
        check_run(lab, job, d, files, 0, "succeeded", crc)
        check_orderly(lab, job, d, files, 0)
        lab.assert_quiet(f"job {job}")
        print(f"job {job}: completed in {time.time() - t0:.1f}s, crc32c {crc} (the uninterrupted "
              f"run's), ended in order")

    slurm_case(src, binary, body)


def slurm_drain(src, binary):
    """`scancel --signal=TERM --full` at a step: the agents drain, the job checkpoints and ends
    preempted, the script requeues it and the requeued run resumes to the uninterrupted CRC."""
    def body(lab):
        d = lab.job_dir("drain", steps=100, every=50)
        crc = lab.reference(d).crc()
        t0 = time.time()
        job = lab.sbatch(d, "--nodes=3")
        deadline, step = time.time() + 120, 0
        while step < DRAIN_STEP:
            if time.time() > deadline:
                fail(f"job {job} did not reach step {DRAIN_STEP}:\n{lab.logs(job, d)}")
            for log in glob.glob(f"{d}/troupe-{job}/run-0/logs/*-job-*.out"):
                steps = re.findall(r"^step +(\d+)/", read(log), re.M)
                step = max([step] + [int(s) for s in steps])
            time.sleep(0.1)
        r = lab.on("h1", "scancel", "--signal=TERM", "--full", job)
        if r.returncode != 0:
            fail(f"scancel: {r.stdout}{r.stderr}")
        print(f"job {job}: scancel --signal=TERM --full at step {step}")
        info = lab.wait_done(job, d, 240)
        files = lab.files(job, d)
        if info.get("JobState") != "COMPLETED" or info.get("Restarts") != "1":
            fail(f"job {job}: {info.get('JobState')}, {info.get('Restarts')} restarts (want one):"
                 f"\n{lab.logs(job, d)}")
        first = check_run(lab, job, d, files, 0, "preempted")
        drained = int(re.search(r"step (\d+)/100", first).group(1))
        if not step <= drained < 100:
            fail(f"run 0 was preempted at step {drained}, not after the notice at {step}")
        if "requeueing job" not in files["out"]:
            fail(f"the script did not requeue the job:\n{files['out']}")
        check_run(lab, job, d, files, 1, "succeeded", crc)
        resumed = runs_of(files["job.log"])[1]
        if not re.search(rf"at step {drained}, state from checkpoint step-{drained}\b", resumed):
            fail(f"run 1 did not resume from run 0's checkpoint of step {drained}:\n{resumed}")
        check_orderly(lab, job, d, files, 1)
        lab.assert_quiet(f"job {job}")
        print(f"job {job}: preempted at step {drained}, requeued, resumed there and completed in "
              f"{time.time() - t0:.1f}s in all, crc32c {crc} (the uninterrupted run's)")

    slurm_case(src, binary, body)


def slurm_shared(src, binary):
    """Two jobs at once on the same nodes (one with two workers per node): each its own head's
    port, both complete with their CRCs."""
    def body(lab):
        two = lab.job_dir("two", steps=20, seed=1, microbatches=8)
        one = lab.job_dir("one", steps=20, seed=2)
        refs = {two: lab.reference(two), one: lab.reference(one)}
        refs = {d: ref.crc() for d, ref in refs.items()}
        t0 = time.time()
        jobs = {two: lab.sbatch(two, "--nodes=3", "--cpus-per-task=3",
                                env={"TROUPE_WORKERS_PER_NODE": "2"}),
                one: lab.sbatch(one, "--nodes=3")}
        infos = {d: lab.wait_done(job, d, 150) for d, job in jobs.items()}
        ports, crcs = set(), set()
        for d, job in jobs.items():
            files = lab.files(job, d)
            if infos[d].get("JobState") != "COMPLETED":
                fail(f"job {job}: {infos[d].get('JobState')}:\n{lab.logs(job, d)}")
            crc = refs[d]
            status = check_run(lab, job, d, files, 0, "succeeded", crc)
            check_orderly(lab, job, d, files, 0)
            world = 6 if d == two else 3
            if f"world {world} " not in status:
                fail(f"job {job}: expected {world} ranks ({world // 3} per node):\n{status}")
            cpus = "cpu=3" if d == two else "cpu=2"
            if files["nodes.log"].count(f"with {cpus} as") != 3:
                fail(f"job {job}: the agents do not offer their allocation, {cpus}:\n"
                     f"{files['nodes.log']}")
            ports.add(re.search(r"head at 10\.77\.1\.2:(\d+)", files["out"]).group(1))
            crcs.add(crc)
            print(f"job {job}: {infos[d].get('NodeList')} {infos[d].get('StartTime')} to "
                  f"{infos[d].get('EndTime')}, world {world}, crc32c {crc} (the uninterrupted "
                  f"run's)")
        a, b = infos.values()
        if not (a["NodeList"] == b["NodeList"] and a["StartTime"] <= b["EndTime"]
                and b["StartTime"] <= a["EndTime"]):
            fail(f"the jobs did not share the nodes at once: {a} {b}")
        if len(ports) != 2 or len(crcs) != 2:
            fail(f"expected two heads' ports and two CRCs: {ports} {crcs}")
        lab.assert_quiet("both jobs")
        print(f"both jobs completed at once in {time.time() - t0:.1f}s")

    slurm_case(src, binary, body)


if __name__ == "__main__":
    cases = {"kubernetes": kubernetes, "dockerfile": dockerfile, "slurm_job": slurm_job,
             "slurm_drain": slurm_drain, "slurm_shared": slurm_shared}
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in cases:
        fail(f"usage: deploy_test.py {{{'|'.join(cases)}}} SOURCE_DIR [TROUPE_BINARY]")
    if sys.argv[1] == "dockerfile":
        dockerfile(sys.argv[2])
    else:
        if len(sys.argv) != 4:
            fail(f"{sys.argv[1]}: expected the troupe binary")
        cases[sys.argv[1]](sys.argv[2], os.path.abspath(sys.argv[3]))
