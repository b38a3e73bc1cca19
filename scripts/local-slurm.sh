#!/usr/bin/env bash
# local-slurm.sh -- a throw-away Slurm cluster on this one machine, for tests and CI.
#
# munged + slurmctld + one slurmd per fake node (n1..nN, all on this host, distinct ports),
# optional fake GPUs, started by hand (no systemd needed). Debian/Ubuntu, slurm-wlm >= 22.05,
# must run as root.
#
#   scripts/local-slurm.sh up              idempotent: a no-op when already up with the same config,
#                                          otherwise (re)start with fresh state (job ids restart at 1)
#   scripts/local-slurm.sh down            cancel all jobs, stop the daemons this script started
#   scripts/local-slurm.sh down --purge    ... and delete $LOCAL_SLURM_DIR and its /etc/slurm links
#   scripts/local-slurm.sh status          daemons and nodes; exit 1 when the cluster is not up
#
# Settings (environment):
#   LOCAL_SLURM_DIR=/var/tmp/slurm-local   config, state, spool, logs, pid files, fake GPU devices
#   LOCAL_SLURM_NODES=2                    fake nodes n1..nN (a 2-node Ray job needs 2)
#   LOCAL_SLURM_FAKE_GPUS=0                >0: GresTypes=gpu and N fake GPU devices per node
#   LOCAL_SLURM_PROCTRACK=auto             cgroup | linuxproc | auto (cgroup when the cgroup-v1 freezer is
#                                          writable; only cgroup reaps daemons that jobs leave behind)
#   LOCAL_SLURM_PARTITION=debug
#   LOCAL_SLURM_PORT_BASE=6817             slurmctld = BASE, slurmd = BASE+10 ...
#   LOCAL_SLURM_INSTALL=1                  apt-get install slurm-wlm / munge when missing
#   LOCAL_SLURM_LINK_ETC=1                 symlink /etc/slurm/*.conf to the generated config so that
#                                          sbatch/squeue/scontrol work without SLURM_CONF
#
# Only PIDs read from this script's own pid files are signalled (after checking /proc/PID/comm);
# munged is stopped only when this script started it.
set -euo pipefail

DIR=${LOCAL_SLURM_DIR:-/var/tmp/slurm-local}
NODES=${LOCAL_SLURM_NODES:-2}
GPUS=${LOCAL_SLURM_FAKE_GPUS:-0}
PART=${LOCAL_SLURM_PARTITION:-debug}
PORT_BASE=${LOCAL_SLURM_PORT_BASE:-6817}
INSTALL=${LOCAL_SLURM_INSTALL:-1}
LINK_ETC=${LOCAL_SLURM_LINK_ETC:-1}
PROCTRACK=${LOCAL_SLURM_PROCTRACK:-auto}
CONF=$DIR/etc/slurm.conf
MUNGE_PID=/run/munge/munged.pid
export SLURM_CONF=$CONF

log() { printf '[local-slurm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $NODES =~ ^[1-9][0-9]*$ ]] || die "LOCAL_SLURM_NODES must be a positive integer, got '$NODES'"
[[ $GPUS =~ ^[0-9]+$ ]] || die "LOCAL_SLURM_FAKE_GPUS must be a non-negative integer, got '$GPUS'"
[[ $PORT_BASE =~ ^[0-9]+$ ]] || die "LOCAL_SLURM_PORT_BASE must be a port number, got '$PORT_BASE'"
[[ $PART =~ ^[A-Za-z0-9_-]+$ ]] || die "LOCAL_SLURM_PARTITION must match [A-Za-z0-9_-]+, got '$PART'"
case $PROCTRACK in auto | cgroup | linuxproc) ;; *) die "LOCAL_SLURM_PROCTRACK must be auto, cgroup or linuxproc" ;; esac
SLURMD_PORT=$((PORT_BASE + 10))

# --- processes: by pid file, zombie-aware ---------------------------------------------------
# Daemons fork and are re-parented to PID 1. When PID 1 reaps lazily (containers), a stopped
# daemon lingers as a zombie and `kill -0` still succeeds, so look at /proc/PID/stat instead.
alive() { # alive PID COMM
  local pid=$1 comm=$2 state
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/stat ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1 # guards against PID reuse
  state=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [[ $state != Z && $state != X ]]
}
pid_in() { if [[ -s $1 ]]; then cat "$1"; fi; }
stop_pid() { # stop_pid PIDFILE COMM
  local pidfile=$1 comm=$2 pid i
  pid=$(pid_in "$pidfile")
  if alive "$pid" "$comm"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do alive "$pid" "$comm" || break; sleep 0.1; done
    if alive "$pid" "$comm"; then
      log "$comm ($pid) ignored SIGTERM, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $comm (pid $pid)"
  fi
  rm -f "$pidfile"
}
wait_for() { # wait_for SECONDS CMD...
  local n=$(($1 * 5)) i
  shift
  for ((i = 0; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}
node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "n$i"; done; }

# --- packages ---------------------------------------------------------------------------------
install_missing() {
  local pkgs=()
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null || pkgs+=(slurm-wlm)
  command -v munged >/dev/null || pkgs+=(munge)
  ((${#pkgs[@]})) || return 0
  ((INSTALL)) || die "missing packages: ${pkgs[*]} (set LOCAL_SLURM_INSTALL=1 or install them)"
  log "apt-get install ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}

# --- config -----------------------------------------------------------------------------------
render_conf() {
  local host hw gres=""
  host=$(hostname -s)
  # `slurmd -C` prints the node's real layout; use all of it (CPUs alone makes slurmd complain).
  hw=$(slurmd -C 2>/dev/null | awk '/^NodeName=/{ $1 = ""; sub(/^ /, ""); print; exit }')
  [[ -n $hw ]] || die "slurmd -C printed no NodeName line"
  ((GPUS > 0)) && gres=" Gres=gpu:$GPUS"
  cat <<EOF
# generated by scripts/local-slurm.sh; do not edit
ClusterName=localci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/$PROCTRACK
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
ReturnToService=2
MailProg=/bin/true
KillWait=5
MinJobAge=600
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
EOF
  ((GPUS > 0)) && echo "GresTypes=gpu"
  echo "NodeName=n[1-$NODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$SLURMD_PORT-$((SLURMD_PORT + NODES - 1))] $hw$gres State=UNKNOWN"
  echo "PartitionName=$PART Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

render_extra() { # gres.conf and cgroup.conf, only when needed
  local n i
  rm -f "$DIR/etc/gres.conf" "$DIR/etc/cgroup.conf"
  if ((GPUS > 0)); then
    for n in $(node_names); do
      echo "NodeName=$n Name=gpu File=$DIR/dev/$n-gpu[0-$((GPUS - 1))]" >>"$DIR/etc/gres.conf"
      for ((i = 0; i < GPUS; i++)); do
        # Slurm drops GPUs without a device file and rejects regular files: use /dev/null's numbers.
        [[ -c $DIR/dev/$n-gpu$i ]] || mknod "$DIR/dev/$n-gpu$i" c 1 3
      done
    done
  fi
  if [[ $PROCTRACK == cgroup ]]; then
    printf '%s\n' CgroupPlugin=cgroup/v1 CgroupMountpoint=/sys/fs/cgroup \
      ConstrainCores=no ConstrainRAMSpace=no ConstrainDevices=no >"$DIR/etc/cgroup.conf"
  fi
}

link_etc() {
  ((LINK_ETC)) || return 0
  mkdir -p /etc/slurm
  local f
  for f in slurm.conf gres.conf cgroup.conf; do
    if [[ -e /etc/slurm/$f && ! -L /etc/slurm/$f ]]; then
      mv "/etc/slurm/$f" "/etc/slurm/$f.bak-local-slurm"
      log "moved the existing /etc/slurm/$f to $f.bak-local-slurm"
    fi
    if [[ -e $DIR/etc/$f ]]; then
      ln -sfn "$DIR/etc/$f" "/etc/slurm/$f"
    elif [[ -L /etc/slurm/$f && $(readlink "/etc/slurm/$f") == "$DIR/etc/$f" ]]; then
      rm -f "/etc/slurm/$f"
    fi
  done
}

# --- daemons ----------------------------------------------------------------------------------
start_munge() {
  if alive "$(pid_in $MUNGE_PID)" munged && munge -n </dev/null >/dev/null 2>&1; then return 0; fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge /etc/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge
  chmod 0755 /run/munge
  [[ -s /etc/munge/munge.key ]] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock "$MUNGE_PID"
  runuser -u munge -- /usr/sbin/munged # forks and writes $MUNGE_PID
  wait_for 10 munge -n || die "munged does not answer (see /var/log/munge/munged.log)"
  touch "$DIR/run/munged.ours"
  log "munged started (pid $(pid_in $MUNGE_PID))"
}

nodes_idle() { [[ $(sinfo -h -N -p "$PART" -o '%T' 2>/dev/null | grep -cx idle) -eq $NODES ]]; }

slurm_running() {
  alive "$(pid_in "$DIR/run/slurmctld.pid")" slurmctld || return 1
  local n
  for n in $(node_names); do alive "$(pid_in "$DIR/run/slurmd-$n.pid")" slurmd || return 1; done
}

stop_slurm_daemons() {
  local f
  for f in "$DIR"/run/slurmd-*.pid; do [[ -e $f ]] && stop_pid "$f" slurmd; done
  stop_pid "$DIR/run/slurmctld.pid" slurmctld
}

cancel_all_jobs() {
  alive "$(pid_in "$DIR/run/slurmctld.pid")" slurmctld || return 0
  local jobs
  jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  [[ -n ${jobs// /} ]] || return 0
  log "cancelling jobs: $jobs"
  # shellcheck disable=SC2086  # one argument per job id
  scancel $jobs 2>/dev/null || true
  wait_for 60 test -z "$(squeue -h -o %i 2>/dev/null)" || log "jobs still listed: $(squeue -h -o %i | tr '\n' ' ')"
}

# --- commands ---------------------------------------------------------------------------------
cmd_up() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (it starts munged, slurmctld and slurmd)"
  [[ $PROCTRACK != auto ]] || PROCTRACK=$(detect_proctrack)
  install_missing
  mkdir -p "$DIR"/{etc,state,spool,log,run,dev}
  local new n
  new=$(render_conf)
  if slurm_running && [[ -f $CONF && $new == "$(cat "$CONF")" ]]; then
    start_munge
    wait_for 30 nodes_idle || die "running, but nodes are not idle: $(sinfo -N -o '%N %T %E' | tr '\n' ' ')"
    log "already up"
    return 0
  fi
  cancel_all_jobs
  stop_slurm_daemons
  printf '%s\n' "$new" >"$CONF"
  render_extra
  link_etc
  start_munge
  rm -rf "$DIR/state" "$DIR/spool" # fresh controller state: no stale jobs or drained nodes
  mkdir -p "$DIR/state"
  for n in $(node_names); do mkdir -p "$DIR/spool/$n"; done
  slurmctld -i || die "slurmctld failed (see $DIR/log/slurmctld.log)"
  for n in $(node_names); do slurmd -N "$n" || die "slurmd -N $n failed (see $DIR/log/slurmd-$n.log)"; done
  if ! wait_for 30 nodes_idle; then
    sinfo -N -o '%N %T %E' >&2 || true
    tail -n 20 "$DIR"/log/slurm*.log >&2 || true
    die "nodes did not become idle"
  fi
  log "up: $(sinfo -h -o '%P %D %T %G' | tr '\n' ' ')proctrack=$PROCTRACK (SLURM_CONF=$CONF)"
}

detect_proctrack() {
  local probe=/sys/fs/cgroup/freezer/.local-slurm-probe
  if [[ -d /sys/fs/cgroup/freezer ]] && mkdir "$probe" 2>/dev/null; then
    rmdir "$probe"
    echo cgroup
  else
    echo linuxproc
  fi
}

cmd_down() {
  cancel_all_jobs
  stop_slurm_daemons
  if [[ -e $DIR/run/munged.ours ]]; then
    stop_pid "$MUNGE_PID" munged
    rm -f "$DIR/run/munged.ours"
  fi
  if [[ ${1:-} == --purge ]]; then
    local f
    for f in slurm.conf gres.conf cgroup.conf; do
      if [[ -L /etc/slurm/$f && $(readlink "/etc/slurm/$f") == "$DIR/etc/$f" ]]; then rm -f "/etc/slurm/$f"; fi
    done
    rm -rf "$DIR"
    log "purged $DIR"
  fi
  log "down"
}

show_daemon() { # show_daemon COMM PIDFILE
  if alive "$(pid_in "$2")" "$1"; then echo "$1 up (pid $(cat "$2"))"; else echo "$1 down"; fi
}

cmd_status() {
  local f
  show_daemon munged "$MUNGE_PID"
  show_daemon slurmctld "$DIR/run/slurmctld.pid"
  for f in "$DIR"/run/slurmd-*.pid; do [[ -e $f ]] && show_daemon slurmd "$f"; done
  alive "$(pid_in "$DIR/run/slurmctld.pid")" slurmctld || return 1
  sinfo -N -o '%N %P %T %c %m %G'
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down "${2:-}" ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 up | down [--purge] | status" >&2
    exit 2
    ;;
esac
