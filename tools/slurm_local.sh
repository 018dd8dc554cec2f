#!/usr/bin/env bash
# A single-node Slurm cluster on this machine (tests, local trials of launch/*.sbatch).
#   tools/slurm_local.sh start DIR   write DIR/slurm.conf, start munged (if not running), slurmctld, slurmd;
#                                    wait until `sinfo` reports the node idle
#   tools/slurm_local.sh stop DIR    stop the slurmctld, slurmd (and munged, if `start` started it) of DIR
# Then: export SLURM_CONF=DIR/slurm.conf; sbatch ...
# Needs root and Debian's slurmctld, slurmd and munge packages
#   (apt-get update && apt-get install -y slurmctld slurmd munge).
# Env: SLURM_LOCAL_PORT (slurmctld port, default 6917; slurmd uses +1), SLURM_LOCAL_CPUS (CPUs to
#      offer; default all, from `slurmd -C`).
set -euo pipefail
cmd="${1:?usage: $0 start|stop DIR}"; dir="$(mkdir -p "${2:?usage: $0 start|stop DIR}" && cd "$2" && pwd)"

stop() {
  for daemon in slurmd slurmctld munged; do
    local pidfile="$dir/$daemon.pid"
    if [ -f "$pidfile" ]; then
      local pid; pid="$(cat "$pidfile")"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$pidfile"
    fi
  done
}

start() {
  for bin in slurmctld slurmd munged sinfo; do
    command -v "$bin" >/dev/null || { echo "slurm_local: $bin not found (apt-get install slurmctld slurmd munge)" >&2; exit 3; }
  done
  local port="${SLURM_LOCAL_PORT:-6917}" host; host="$(hostname -s)"
  local node; node="$(slurmd -C | head -n1)"   # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
  [ -n "${SLURM_LOCAL_CPUS:-}" ] && node="NodeName=$host CPUs=$SLURM_LOCAL_CPUS"
  stop  # leftovers of an earlier start in DIR
  mkdir -p "$dir/state" "$dir/spool"
  cat > "$dir/slurm.conf" <<CONF
ClusterName=distnerf-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5   # a requeued job may start cred_expire + 1 s after the requeue (default 120)
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=1
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
MinJobAge=600
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  if ! pgrep -u munge -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    cp /run/munge/munged.pid "$dir/munged.pid"  # started here: `stop` ends it too
  fi
  for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF" -i   # -i: ignore state from an earlier cluster in DIR
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 150); do
    if [ "$(sinfo -h -o %t 2>/dev/null | head -n1)" = "idle" ]; then
      echo "slurm_local: node idle (SLURM_CONF=$SLURM_CONF)"; return 0
    fi
    sleep 0.1
  done
  echo "slurm_local: node not idle after 15 s; sinfo: $(sinfo 2>&1 | tail -n +2); logs in $dir" >&2
  stop; exit 4
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
