#!/usr/bin/env bash
# `make test-slurm`: a one-node SLURM cluster on localhost, the tests marked `slurm` against it,
# then the daemons stopped.
#
#   bash tests/slurm/cluster.sh [pytest ...]      (default: .venv/bin/pytest -m slurm -q tests/slurm)
#
# Installs Debian's slurm-wlm and munge when missing (as root; otherwise skips with one line), and
# starts munged, slurmctld and slurmd as children of this script with a generated config, a fresh
# munge key, sockets, state and logs in one temporary directory (nothing is written under /etc).
# Accounting is off (no slurmdbd), as on many small clusters.  The daemons are stopped by their
# pids when the script exits, whatever the outcome; the directory (with the logs) is kept only
# when the tests failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

export PATH="$PATH:/usr/sbin:/sbin"  # the daemons live in sbin, often not on a user's PATH
skip() { echo "test-slurm: SKIPPED: $*"; exit 0; }

missing=()
for cmd in munged slurmctld slurmd sbatch; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
if ((${#missing[@]})); then
  [ "$(id -u)" -eq 0 ] || skip "${missing[*]} not installed and not root to install them (sudo apt-get install slurm-wlm munge)"
  command -v apt-get >/dev/null || skip "${missing[*]} not installed and no apt-get to install slurm-wlm and munge"
  echo "test-slurm: installing slurm-wlm and munge (apt-get)"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge; } \
    >/tmp/raco-test-slurm-apt.log 2>&1 || skip "apt-get install slurm-wlm munge failed (log: /tmp/raco-test-slurm-apt.log)"
fi
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to start jobs (run make test-slurm as root)"

dir=$(mktemp -d /tmp/raco-slurm.XXXXXX)
chmod 711 "$dir"
pids=()
status=1
stop() {
  # cancel what is left, then stop the daemons this script started (newest first), by pid
  if [ -n "${SLURM_CONF:-}" ]; then timeout 10 scancel --user "$(id -un)" 2>/dev/null || true; fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  if [ "$status" -eq 0 ]; then rm -rf "$dir"; else echo "test-slurm: daemon logs kept in $dir" >&2; fi
}
trap stop EXIT
trap "exit 130" INT
trap "exit 143" TERM HUP

host=$(hostname -s)
read -r ctld_port slurmd_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
# a modest node: 2 CPUs and a quarter of the memory, at most 4 GiB (scheduling only: no cgroups)
mem_mb=$(awk '/^MemTotal:/ {m = int($2 / 1024 / 4); print (m > 4096 ? 4096 : m)}' /proc/meminfo)
mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 600 "$dir/munge/munge.key"
: >"$dir/plugstack.conf"
cat >"$dir/slurm.conf" <<CONF
ClusterName=raco-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
PlugStackConfig=$dir/plugstack.conf
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
EnforcePartLimits=ALL
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"

munged --foreground --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" >"$dir/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.2; done
slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$dir/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 60); do
  [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break
  sleep 1
done
[ "$(sinfo -h -o %T 2>/dev/null)" = idle ] || { echo "test-slurm: the node did not come up (logs in $dir)" >&2; exit 1; }
echo "test-slurm: one-node cluster $host (2 CPUs, ${mem_mb} MB) up, SLURM_CONF=$SLURM_CONF"

set +e
if (($#)); then "$@"; else .venv/bin/pytest -m slurm -q -p no:cacheprovider tests/slurm; fi
status=$?
exit "$status"
