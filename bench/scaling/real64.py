"""bench/scale's real part: the README's job with --workers 64 (tiny GPT, microbatches = 64,
max_workers = 64) on this machine, a kill -9 at step 5 and a join at step 9, against the same spec
on 4 workers. Prints what it measured and `real64_*=` keys (read by bench/scale)."""
import os, re, statistics, subprocess, sys, tempfile, time

troupe, workers, steps = sys.argv[1], int(sys.argv[2]), 12
root = tempfile.mkdtemp(prefix="troupe-bench-real64-")
spec = os.path.join(root, "job.toml")
with open(spec, "w") as f:
    f.write(f'[job]\nname = "s"\nsteps = {steps}\n[model]\nmicrobatches = {workers}\n'
            f'[elastic]\nmin_workers = 1\nmax_workers = {workers}\n[checkpoint]\nevery = 5\n')


def tcp_established(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            m = re.match(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))

    def established():  # by inode: a table read while it changes repeats or skips lines
        out = set()
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as t:
                out |= {x[9] for x in map(str.split, t.readlines()[1:]) if x[3] == "01"}
        return out
    last = established()
    for _ in range(4):  # until two reads in a row agree
        again = established()
        if again == last:
            break
        last = again
    return len(last & inodes)


def workers_of(work_dir):
    """Rank workers (not the coordinator's) of the run: pid by their stdout's log name."""
    out = {}
    logs = os.path.join(work_dir, "logs") + "/"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            target = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            continue
        if len(argv) > 1 and argv[1] == b"worker" and target.startswith(logs) and "coord-" not in target:
            out[target[len(logs):]] = int(pid)
    return out


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0


def run(n, chaos):
    work = os.path.join(root, f"w{n}")
    cmd = [troupe, "train", "--spec", spec, "--workers", str(n), "--work_dir", work,
           "--report", work + ".report"] + chaos
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t_up = t_first = None
    sample = None
    for line in p.stdout:
        now = time.monotonic()
        if line.startswith("embedded cluster:"):
            t_up = now
        if t_first is None and re.match(r"step\s+1/", line):
            t_first = now
        if sample is None and n > 4 and re.match(r"step\s+2/", line):
            conns, rss = [], []
            for pid in workers_of(work).values():
                try:  # a process gone meanwhile is left out
                    c, r = tcp_established(pid), rss_mb(pid)
                except OSError:
                    continue
                conns.append(c)
                rss.append(r)
            sample = (len(conns), conns, rss)
    p.wait()
    report = dict(kv.split("=", 1) for kv in open(work + ".report").read().split())
    step_s = []
    for line in open(os.path.join(work, "logs", "events.log")):
        m = re.search(r"event=step .*step_s=([0-9.]+)", line)
        if m:
            step_s.append(float(m.group(1)))
    return report, t_first - t_up, statistics.median(step_s), sample


ref, ref_start, ref_step, _ = run(4, [])
big, start, step, (nworkers, conns, rss) = run(workers, ["--chaos", "kill-worker@5", "--chaos", "join-worker@9"])
print(f"{workers} workers: crc {big['crc32c']} vs 4 workers {ref['crc32c']} "
      f"({'bit-identical' if big['crc32c'] == ref['crc32c'] else 'DIFFERENT'}); "
      f"world {big['world']}, {big['generations']} generations, steps lost {big['steps_lost']}")
print(f"start (cluster up -> first step): {start:.2f} s ({ref_start:.2f} s at 4)")
print(f"median step: {step:.3f} s vs {ref_step:.3f} s at 4 (+{step - ref_step:.3f} s per step)")
print(f"{nworkers} rank workers: TCP connections each median {statistics.median(conns):.0f} "
      f"max {max(conns)} (all control: one host, shared memory carries the data); "
      f"RSS median {statistics.median(rss):.0f} MB max {max(rss):.0f} MB")
print(f"recovery from the kill -9: {float(big['recovery_s']):.2f} s (fault -> the redone steps committed)")
print(f"real64_start_s={start:.2f} real64_recovery_s={float(big['recovery_s']):.2f} "
      f"real64_ctrl_conns_per_worker={max(conns)} real64_conns_per_worker={max(conns)} "
      f"real64_identical={int(big['crc32c'] == ref['crc32c'])} real64_step_overhead_s={step - ref_step:.3f} "
      f"real64_rss_mb={max(rss):.0f}")
subprocess.run(["rm", "-rf", root])
