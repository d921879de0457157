#!/usr/bin/python3
"""DeployTest: deploy/ checked offline (no cluster or container engine is reachable here).

  deploy_test.py CASE SOURCE_DIR [TROUPE_BINARY]
CASE: kubernetes (the manifests against Kubernetes' schemas, kubernetes-validate --strict, and
the settings the manifests promise; each pod's init container's certificate command run with
TROUPE_BINARY and its certificate checked with openssl), dockerfile (hadolint), slurm (the batch script against a
fake srun/scontrol/troupe), slurm_requeue (a preempted job, exit 75, is requeued), slurm_failure
(a failed job's exit status is the script's). The validators come from PyPI into
/opt/troupe/deploy-tools (scripts/setup); a missing one fails the test, naming it.
"""
import os
import re
import subprocess
import sys
import tempfile

TOOLS = os.environ.get("TROUPE_DEPLOY_TOOLS", "/opt/troupe/deploy-tools")


def fail(msg):
    print(f"DeployTest: {msg}", file=sys.stderr)
    sys.exit(1)


def tool(name):
    path = os.path.join(TOOLS, "bin", name)
    if not os.access(path, os.X_OK):
        fail(f"{path} not found: run scripts/setup (it installs the PyPI validators there)")
    return path


def run(cmd, env=None, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, **kw)


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


FAKE_TROUPE = """#!/bin/bash
echo "troupe $*" >> "$FAKE_LOG"
case "$1" in
  # A submitted job runs a while: until the head and the node agents have started.
  job) case "$2" in
         submit) echo job-1 ;;
         wait) for _ in $(seq 100); do
                 grep -q "^troupe head" "$FAKE_LOG" && grep -q "^srun" "$FAKE_LOG" && break
                 sleep 0.05
               done
               exit "${FAKE_JOB_RC:-0}" ;;
       esac ;;
  *) sleep 60 & trap 'kill $! 2>/dev/null; exit 0' TERM; wait ;;
esac
"""
FAKE_SRUN = """#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
sleep 60 & trap 'kill $! 2>/dev/null; exit 0' TERM; wait
"""
FAKE_SCONTROL = """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then printf 'gpu001\\ngpu002\\ngpu003\\n'; exit 0; fi
echo "scontrol $*" >> "$FAKE_LOG"
"""


def slurm_run(src, job_rc, d):
    bin_dir = os.path.join(d, "bin")
    os.makedirs(bin_dir)
    for name, text in (("troupe", FAKE_TROUPE), ("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        p = os.path.join(bin_dir, name)
        with open(p, "w") as f:
            f.write(text)
        os.chmod(p, 0o755)
    log = os.path.join(d, "calls.log")
    env = dict(os.environ, PATH=bin_dir + ":" + os.environ["PATH"], FAKE_LOG=log,
               FAKE_JOB_RC=str(job_rc), TROUPE="troupe", SLURM_JOB_ID="42",
               SLURM_JOB_NODELIST="gpu[001-003]", SLURM_JOB_NUM_NODES="3", SLURM_SUBMIT_DIR=d)
    r = run(["bash", os.path.join(src, "deploy/slurm/troupe.sbatch"), "job.toml"], env=env, cwd=d)
    calls = open(log).read() if os.path.exists(log) else ""
    print(r.stdout + r.stderr + "calls:\n" + calls)
    return r.returncode, calls


def slurm(src):
    header = open(os.path.join(src, "deploy/slurm/troupe.sbatch")).read()
    if "#SBATCH --signal=TERM@60" not in header or "#SBATCH --requeue" not in header:
        fail("the script does not ask SLURM for the notice (--signal=TERM@60) and --requeue")
    with tempfile.TemporaryDirectory(prefix="troupe-deploy-test.") as d:
        slurm_check(src, d)


def slurm_check(src, d):
    rc, calls = slurm_run(src, 0, d)
    if rc != 0:
        fail(f"the script exited {rc} for a job that finished")
    state = os.path.join(d, "troupe-42")
    want = [
        f"troupe head --host 0.0.0.0 --port 7000 --store {state}/head.db",
        "srun --nodes=3 --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c",
        "troupe job submit --head gpu001:7000 --spec job.toml",
        "troupe job wait job-1 --head gpu001:7000",
    ]
    for w in want:
        if w not in calls:
            fail(f"expected a call '{w}'")
    m = re.search(r"node --head (\S+) .* --grace (\d+)s", calls)
    if not m or m.group(1) != "gpu001:7000" or not int(m.group(2)) < 60:
        fail("the node agents do not join the first node's head, or drain longer than the notice")
    if "requeue" in calls:
        fail("a finished job was requeued")
    print("slurm: head on the first node, an agent per node, the job submitted")


def slurm_requeue(src):
    with tempfile.TemporaryDirectory(prefix="troupe-deploy-test.") as d:
        rc, calls = slurm_run(src, 75, d)
    if rc != 0 or "scontrol requeue 42" not in calls:
        fail(f"a preempted job (exit 75) was not requeued (exit {rc})")
    print("slurm: a preempted job is requeued")


def slurm_failure(src):
    with tempfile.TemporaryDirectory(prefix="troupe-deploy-test.") as d:
        rc, calls = slurm_run(src, 1, d)
    if rc != 1 or "requeue" in calls:
        fail(f"a failed job: expected exit 1 and no requeue, got exit {rc}")
    print("slurm: a failed job's status is the script's")


if __name__ == "__main__":
    cases = {"kubernetes": kubernetes, "dockerfile": dockerfile, "slurm": slurm,
             "slurm_requeue": slurm_requeue, "slurm_failure": slurm_failure}
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in cases:
        fail(f"usage: deploy_test.py {{{'|'.join(cases)}}} SOURCE_DIR [TROUPE_BINARY]")
    if sys.argv[1] == "kubernetes":
        if len(sys.argv) != 4:
            fail("kubernetes: expected the troupe binary (it runs the init containers' command)")
        kubernetes(sys.argv[2], sys.argv[3])
    else:
        cases[sys.argv[1]](sys.argv[2])
