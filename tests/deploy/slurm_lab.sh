#!/usr/bin/env bash
# A real SLURM cluster (Debian's slurm-wlm: slurmctld, slurmd, munged) on the lab's namespaced hosts
# (scripts/lab), for DeployTest and by hand: each host its own node, named like a Debian machine
# whose host name resolves to 127.0.1.1 on itself.
#
#   tests/deploy/slurm_lab.sh up [--name L] [--hosts N] [--cpus C]
#       the lab L (default trlabs) of N hosts (3) L-h1..L-hN, each a SLURM node of C CPUs (6;
#       more than the machine has: the jobs share it), one partition "lab"; slurmctld and munged
#       on L-h1. Prints the SLURM_CONF to export and the shared directory (the same path on every
#       host) to submit from.
#   tests/deploy/slurm_lab.sh down [--name L]
#       cancels what runs, stops (SIGTERM) slurmctld, every slurmd and munged, then removes the lab
#       with all of its state; exits 1 (after removing it all) if a process outlived its orderly
#       stop.
#   tests/deploy/slurm_lab.sh env [--name L]    prints `export SLURM_CONF=...`
#
# Run commands on a host with scripts/lab exec, SLURM_CONF exported, from the shared directory:
#   eval "$(tests/deploy/slurm_lab.sh env)"; cd /var/tmp/troupe-lab/trlabs/shared
#   scripts/lab exec trlabs-h1 sbatch --nodes=3 ...
#
# Everything lives in the lab's shared directory /var/tmp/troupe-lab/L/shared/slurm (munge's key
# and socket, slurm.conf with AuthInfo=socket=, the controller's state, each slurmd's spool and
# every log), which `down` removes with the lab. No cgroups: proctrack/linuxproc, task/none (and a
# cgroup.conf naming cgroup/v1 at an empty mount point, as slurmd 22.05 loads its cgroup plugin
# anyway and the lab's fresh /sys has no /sys/fs/cgroup). Needs root, scripts/lab's tools, and the
# packages slurmctld, slurmd, slurm-client and munge.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAB=$HERE/../../scripts/lab

die() {
  echo "slurm_lab: error: $*" >&2
  exit 1
}

name=trlabs hosts=3 cpus=6
cmd=${1:-}
[ $# -eq 0 ] || shift
while [ $# -gt 0 ]; do
  case $1 in
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --hosts) hosts=${2:?--hosts needs a count}; shift 2 ;;
    --cpus) cpus=${2:?--cpus needs a count}; shift 2 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[[ $name =~ ^trlab[a-z0-9]{0,4}$ ]] || die "lab name '$name': want trlab plus up to 4 of [a-z0-9]"
[[ $hosts =~ ^[1-9]$ ]] || die "--hosts $hosts: want 1..9"
[[ $cpus =~ ^[1-9][0-9]*$ ]] || die "--cpus $cpus: want a count"

SHARED=/var/tmp/troupe-lab/$name/shared
S=$SHARED/slurm
export SLURM_CONF=$S/slurm.conf

on() { "$LAB" exec "$name-$1" "${@:2}"; }

# The processes of host $1 other than its init (and the init's sleep): "pid command" lines.
host_procs() {
  on "$1" ps -e -o pid=,ppid=,args= 2>/dev/null |
    awk '$1 != 1 && !($2 == 1 && $3 == "sleep" && $4 == "3600") && $3 != "ps" { $2 = ""; print }'
}

# Polls COMMAND until it succeeds, for at most SECS seconds of the clock (a poll on a loaded
# machine takes a while itself).
wait_until() {  # SECS DESCRIPTION COMMAND...
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + secs))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  echo "slurm_lab: $what: not within ${secs}s" >&2
  return 1
}

nodes_idle() {
  local n
  n=$(on h1 sinfo --noheader --responding --states=idle --format=%D 2>/dev/null | head -n 1)
  [ "${n:-0}" = "$hosts" ]
}

up() {
  for t in slurmctld slurmd sbatch munged; do
    command -v "$t" >/dev/null ||
      die "'$t' not found: install slurmctld, slurmd, slurm-client and munge (scripts/setup)"
  done
  "$LAB" up "$hosts" --name "$name" >/dev/null
  trap 'echo "slurm_lab: up failed; removing $name" >&2; down >&2 || true' EXIT
  local i j
  mkdir -p "$S"/{munge,run,state,log,cgroup} "$S/spool/$name-h"{1..9}
  chmod 700 "$S/munge"
  chmod 755 "$S/run"
  dd if=/dev/urandom of="$S/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$S/munge/munge.key"
  # Debian's /etc/hosts: the host's own name on 127.0.1.1, the others by their addresses.
  for i in $(seq "$hosts"); do
    {
      printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s-h%d\n' "$name" "$i"
      for j in $(seq "$hosts"); do
        [ "$j" = "$i" ] || printf '10.77.%d.2\t%s-h%d\n' "$j" "$name" "$j"
      done
    } >"$S/hosts.h$i"
    on "h$i" mount --bind "$S/hosts.h$i" /etc/hosts
  done
  : >"$S/plugstack.conf"
  printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=%s/cgroup\nCgroupAutomount=no\n' "$S" \
    >"$S/cgroup.conf"
  {
    cat <<EOF
ClusterName=$name
SlurmctldHost=$name-h1(10.77.1.2)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire (default 120 s) before it may start again.
AuthInfo=socket=$S/run/munge.socket,cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
PlugStackConfig=$S/plugstack.conf
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd.%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.%n.log
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=60
MessageTimeout=10
EOF
    for i in $(seq "$hosts"); do
      echo "NodeName=$name-h$i NodeAddr=10.77.$i.2 CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$SLURM_CONF"
  on h1 munged --key-file="$S/munge/munge.key" --socket="$S/run/munge.socket" \
    --pid-file="$S/run/munged.pid" --log-file="$S/log/munged.log" --seed-file="$S/munge/munged.seed"
  on h1 slurmctld -f "$SLURM_CONF"
  for i in $(seq "$hosts"); do on "h$i" slurmd -f "$SLURM_CONF" -N "$name-h$i"; done
  if ! wait_until 60 "$hosts nodes idle" nodes_idle; then
    on h1 sinfo -N -l >&2 || true
    tail -n 5 "$S"/log/*.log >&2 || true
    exit 1
  fi
  trap - EXIT
  echo "slurm lab $name: $hosts nodes of $cpus CPUs, partition lab;" \
    "slurmctld and munged on $name-h1"
  echo "export SLURM_CONF=$SLURM_CONF"
  echo "shared directory (every host): $SHARED"
}

# True when nothing runs on the lab's hosts but (with $1 = munged) munged.
all_stopped() {
  local i
  for i in $(seq "$hosts"); do
    if host_procs "h$i" | grep -v -q -E "^ *[0-9]+ +${1:-@}( |\$)"; then return 1; fi
  done
}

down() {
  local i p left="" rc=0
  if [ -f "/run/troupe-lab/$name/hosts" ]; then
    hosts=$(wc -l <"/run/troupe-lab/$name/hosts")
    if [ -f "$SLURM_CONF" ]; then
      # What still runs is killed and cancelled (by a slurmctld that runs: a client's call to one
      # that does not waits out MessageTimeout).
      if on h1 pgrep -x slurmctld >/dev/null; then
        on h1 scancel --quiet --user=root --full --signal=KILL 2>/dev/null || true
        on h1 scancel --quiet --user=root 2>/dev/null || true
        wait_until 20 "the jobs ended" jobs_gone || true
      fi
      # SIGTERM to each daemon in its host (`scontrol shutdown` leaves a slurmd running at times:
      # slurmctld exits before its shutdown message reaches every node).
      for i in $(seq "$hosts"); do on "h$i" pkill -TERM -x slurmd || true; done
      on h1 pkill -TERM -x slurmctld || true
      wait_until 20 "slurmctld and slurmd stopped" all_stopped munged || true
      on h1 munged --stop --socket="$S/run/munge.socket" >/dev/null 2>&1 || true
      wait_until 20 "munged stopped" all_stopped || true
    fi
    for i in $(seq "$hosts"); do
      p=$(host_procs "h$i") || continue
      [ -z "$p" ] || left+=$'\n'"  $name-h$i: ${p//$'\n'/$'\n'  $name-h$i: }"
    done
  fi
  "$LAB" down --name "$name" --no-wait >/dev/null || rc=1
  if [ -n "$left" ]; then
    echo "slurm_lab: left after the orderly stop (killed with the lab):$left" >&2
    rc=1
  fi
  [ $rc -ne 0 ] || echo "slurm lab $name: down, nothing left"
  return $rc
}

jobs_gone() { [ -z "$(on h1 squeue --noheader 2>/dev/null)" ]; }

case $cmd in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) die "usage: slurm_lab.sh up|down|env [--name L] [--hosts N] [--cpus C]" ;;
esac
