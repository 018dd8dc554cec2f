# Shared by the launch/ scripts (sourced, not run). The only place that knows cluster flags.
#
# distnerf_setup            cd to the repository (DISTNERF_ROOT, else the sbatch submit directory, else
#                           the parent of launch/), activate .venv when present, check PREEMPT_SIGNAL
#                           (USR1 by default, USR2 or HUP: match sbatch --signal=B:<it>@T), export it to
#                           the ranks (DISTNERF_PREEMPT_SIGNAL) and the signal list torchrun forwards
# distnerf_flight_recorder RUN_DIR   NCCL flight-recorder dumps into RUN_DIR/nccl_trace/ (GPU machines)
# distnerf_head_node LIST   first host of a Slurm node list (the c10d rendezvous host)
# distnerf_socket_ifname HOST   export GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (each unless set) as the
#                           interface that reaches HOST: the one holding HOST's address on HOST itself, else
#                           the one the route to it leaves by. Every step uses gloo (flags, barriers):
#                           on nodes with several interfaces a wrong pick stalls until the set-up timeout
# distnerf_numa_binding    sets the array DISTNERF_BIND to torchrun's --numa-binding=MODE (NUMA_BINDING: node by
#                           default; socket, exclusive, core-complex; none: off) when this node has GPUs in the
#                           job (SLURM_GPUS_ON_NODE > 0) and numactl is installed: each rank and its threads run
#                           on the CPUs of its GPU's NUMA node (within the job's CPUs). Empty, and said, otherwise
# distnerf_check_cpus NPROC warn when the CPUs of the task (SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE) give a
#                           rank fewer than 1 + sampler.num_workers (3 by default): its main thread and its
#                           sampler workers then share cores
# distnerf_run CMD...       run CMD in the background, forward the preemption signal, SIGTERM and SIGINT
#                           to it, wait for it; sets DISTNERF_RC (its exit status) and DISTNERF_SIGNAL
#                           (PREEMPT/TERM/INT or empty). Another of USR1/USR2/HUP than PREEMPT_SIGNAL
#                           says the two settings disagree and is forwarded as the preemption signal
# distnerf_requeue RUN_DIR  after the preemption signal (Slurm's warning before the time limit): requeue this job
#                           unless the run finished (RUN_DIR/metrics.json exists); returns 0 when requeued

distnerf_setup() {
  local here; here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  cd "${DISTNERF_ROOT:-${SLURM_SUBMIT_DIR:-$here}}"
  if [ -f .venv/bin/activate ] && [ -z "${VIRTUAL_ENV:-}" ]; then . .venv/bin/activate; fi
  # torchrun's agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT by default (it forwards them to the
  # ranks and stops); SIGUSR1 would kill it and leave the ranks running. With SIGUSR1 listed
  # (torchrun --signals-to-handle, read from PET_SIGNALS_TO_HANDLE) it forwards that too: the ranks
  # agree on a stop step, checkpoint and exit within the agent's shutdown timeout (--shutdown-timeout,
  # PET_SHUTDOWN_TIMEOUT, 30 s by default), after which it kills them.
  # PREEMPT_SIGNAL: some NCCL releases handle SIGUSR1 themselves; use USR2 or HUP there.
  PREEMPT_SIGNAL="${PREEMPT_SIGNAL:-USR1}"; PREEMPT_SIGNAL="${PREEMPT_SIGNAL#SIG}"
  case "$PREEMPT_SIGNAL" in
    USR1|USR2|HUP) ;;
    *) echo "distnerf: PREEMPT_SIGNAL=$PREEMPT_SIGNAL: must be USR1, USR2 or HUP (and match --signal=B:<it>@T)" >&2
       exit 2;;
  esac
  export PREEMPT_SIGNAL DISTNERF_PREEMPT_SIGNAL="$PREEMPT_SIGNAL"
  export PET_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
  # NCCL's flight recorder: on a collective timeout each rank dumps its last collectives (docs/operations.md,
  # "When a run hangs"; read with torch.distributed.flight_recorder.fr_trace). Ignored by gloo.
  export TORCH_NCCL_TRACE_BUFFER_SIZE="${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}"
  export TORCH_NCCL_DUMP_ON_TIMEOUT="${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}"
}

# distnerf_flight_recorder RUN_DIR: where the ranks' NCCL flight-recorder dumps go (RUN_DIR/nccl_trace/rank_N)
# (made on machines with NVIDIA GPUs only: CPU runs keep their run directory as it was)
distnerf_flight_recorder() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  mkdir -p "${1:?run dir}/nccl_trace"
  export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$1/nccl_trace/rank_}"
}

distnerf_socket_ifname() {
  local host="${1:?host}" addr dev
  addr="$(getent ahostsv4 "$host" 2>/dev/null | awk 'NR == 1 {print $1}')"
  addr="${addr:-$host}"
  dev="$(ip -o -4 addr show 2>/dev/null | awk -v a="$addr" 'index($4, a "/") == 1 {print $2; exit}')"
  [ -n "$dev" ] || dev="$(ip -o route get "$addr" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')"
  if [ -z "$dev" ]; then
    echo "distnerf: no interface reaches $host ($addr): set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME yourself" >&2
    return 0
  fi
  export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$dev}" NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$dev}"
  echo "distnerf: GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME (the interface to $host)" >&2
}

distnerf_numa_binding() {
  DISTNERF_BIND=()
  local mode="${NUMA_BINDING:-node}" gpus="${SLURM_GPUS_ON_NODE:-0}"
  case "$mode" in
    none) return 0;;
    node|socket|exclusive|core-complex) ;;
    *) echo "distnerf: NUMA_BINDING=$mode: must be node, socket, exclusive, core-complex or none" >&2; exit 2;;
  esac
  [[ "$gpus" =~ ^[0-9]+$ ]] || gpus=0
  if [ "$gpus" -eq 0 ]; then
    echo "distnerf: no GPU in this job on $(hostname -s): ranks not NUMA-bound (CPU ranks need device=cpu)" >&2
  elif ! command -v numactl >/dev/null 2>&1; then
    echo "distnerf: numactl not found: the $gpus ranks are not bound to their GPU's NUMA node (install numactl)" >&2
  else
    DISTNERF_BIND=(--numa-binding="$mode")
  fi
}

distnerf_check_cpus() {
  local nproc="${1:?ranks}" cpus="${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-}}"
  if [ -n "$cpus" ] && [ "$cpus" -lt $(( 3 * nproc )) ]; then
    echo "distnerf: $cpus CPUs for $nproc ranks: fewer than 3 a rank (its main thread and sampler.num_workers=2" \
         "workers); ask for --cpus-per-task=$(( 8 * nproc ))" >&2
  fi
  return 0
}

distnerf_head_node() {
  scontrol show hostnames "${1:?node list}" | head -n1
}

distnerf_run() {
  DISTNERF_SIGNAL=""
  "$@" &
  local child=$!
  # bash runs a trap only between commands: `wait` returns early (status > 128) when one arrives,
  # so wait again until the child is gone, then collect its own status
  local sig p="${PREEMPT_SIGNAL:-USR1}"
  for sig in USR1 USR2 HUP; do
    if [ "$sig" = "$p" ]; then
      trap 'DISTNERF_SIGNAL='"$p"'; kill -'"$p"' '"$child"' 2>/dev/null || true' "$sig"
    else  # a --signal that does not match PREEMPT_SIGNAL: say so, and still checkpoint and requeue
      trap 'echo "distnerf: got SIG'"$sig"' but PREEMPT_SIGNAL='"$p"' (sbatch --signal and PREEMPT_SIGNAL differ): treated as SIG'"$p"'" >&2
            DISTNERF_SIGNAL='"$p"'; kill -'"$p"' '"$child"' 2>/dev/null || true' "$sig"
    fi
  done
  trap 'DISTNERF_SIGNAL=${DISTNERF_SIGNAL:-TERM}; kill -TERM '"$child"' 2>/dev/null || true' TERM
  trap 'DISTNERF_SIGNAL=${DISTNERF_SIGNAL:-INT}; kill -INT '"$child"' 2>/dev/null || true' INT
  while kill -0 "$child" 2>/dev/null; do wait "$child" || true; done
  DISTNERF_RC=0
  wait "$child" || DISTNERF_RC=$?
  trap - USR1 USR2 HUP TERM INT
  echo "distnerf: $1 exited with $DISTNERF_RC${DISTNERF_SIGNAL:+ after SIG$DISTNERF_SIGNAL}"
}

distnerf_requeue() {
  local run_dir="${1:?run dir}"
  if [ "${DISTNERF_SIGNAL:-}" = "${PREEMPT_SIGNAL:-USR1}" ] && [ -n "${SLURM_JOB_ID:-}" ] && [ ! -f "$run_dir/metrics.json" ]; then
    echo "distnerf: preempted; requeueing job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0} -> $(( ${SLURM_RESTART_COUNT:-0} + 1 )))"
    scontrol requeue "$SLURM_JOB_ID"  # ends this script; the job runs again, with the same run dir
    return 0
  fi
  return 1
}
