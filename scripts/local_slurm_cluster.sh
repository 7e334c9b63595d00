#!/usr/bin/env bash
# local_slurm_cluster.sh: a real Slurm cluster of fake nodes on this one machine, for the tests
# of run_and_time.sh and the placement check. Debian 12's Slurm 22.05 (built with
# --enable-multiple-slurmd) runs one slurmd per fake node, each on its own port and in its own
# UTS + mount namespace (hostname n1, n2, ...; node names resolve to 127.0.10.x). Nodes share this
# machine's filesystem, so jobs run the same Python environment and see the same checkout.
# topology/tree groups the nodes into racks: tasks see SLURM_TOPOLOGY_ADDR=spine.rack0.n1.
#
#   scripts/local_slurm_cluster.sh up             install Debian's packages if missing (root),
#                                                 start clean, wait until all nodes are idle;
#                                                 a live cluster of the same shape: nothing done
#   scripts/local_slurm_cluster.sh racks ORDER    re-wire racks: block (rack0 = n1,n2) or
#                                                 interleave (rack0 = n1,n3; rack1 = n2,n4)
#   scripts/local_slurm_cluster.sh down           cancel jobs, stop every daemon started here
#   scripts/local_slurm_cluster.sh status
#   scripts/local_slurm_cluster.sh missing        the packages `up` would install, one a line
#
# Environment: SLURM_CI_NODES=4 SLURM_CI_RACKS=2 SLURM_CI_RACK_ORDER=block SLURM_CI_CPUS=2
#   SLURM_CI_MEM=4000 (MB per node) SLURM_CI_DIR=/tmp/llama31_slurm
set -euo pipefail

NODES=${SLURM_CI_NODES:-4}
RACKS=${SLURM_CI_RACKS:-2}
ORDER=${SLURM_CI_RACK_ORDER:-block}
CPUS=${SLURM_CI_CPUS:-2}
MEM=${SLURM_CI_MEM:-4000}
DIR=${SLURM_CI_DIR:-/tmp/llama31_slurm}
ETC=/etc/slurm
PORT0=17100            # slurmd of node i listens on PORT0 + i
MARK='# llama31-slurm'  # tags the lines this script adds to /etc/hosts

say() { echo "[local-slurm $(date +%H:%M:%S)] $*" >&2; }
fail() { say "ERROR: $*"; exit 1; }
node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "n$i"; done; }
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_by_pidfile() {    # TERM the daemons named by pid files, KILL what is left after 10 s
  local f pids=() p alive
  for f in "$@"; do
    if running "$f"; then pids+=("$(cat "$f")"); fi
    rm -f "$f"
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 50); do
    alive=0
    for p in "${pids[@]}"; do if kill -0 "$p" 2>/dev/null; then alive=1; fi; done
    [ "$alive" = 1 ] || return 0
    sleep 0.2
  done
  say "SIGKILL to ${pids[*]}"
  kill -9 "${pids[@]}" 2>/dev/null || true
}

kill_node_leftovers() {  # slurmstepd and tasks left in a fake node's mount namespace
  local nsfile=$1 ns p victims=()
  ns=$(cat "$nsfile" 2>/dev/null || true)
  rm -f "$nsfile"
  [ -n "$ns" ] && [ "$ns" != "$(readlink /proc/self/ns/mnt)" ] || return 0
  for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ]; then victims+=("${p#/proc/}"); fi
  done
  if [ "${#victims[@]}" -gt 0 ]; then kill -9 "${victims[@]}" 2>/dev/null || true; fi
}

missing_packages() {   # the Debian packages the cluster needs that are not installed, one a line
  local p
  for p in slurmctld slurmd slurm-client munge; do
    # installed, not merely known: a package removed without --purge keeps its config files and
    # `dpkg -s` still succeeds for it ("deinstall ok config-files")
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || echo "$p"
  done
}

install_packages() {
  local missing=()
  mapfile -t missing < <(missing_packages)
  [ "${#missing[@]}" -gt 0 ] || return 0
  [ "$(id -u)" = 0 ] || fail "Slurm packages missing (${missing[*]}) and not root to install them"
  say "apt-get install ${missing[*]} (output: $DIR/log/apt.log)"
  mkdir -p "$DIR/log"
  # no systemd here: the packages' postinst cannot start the daemons; `up` starts them. The
  # output goes to the log, shown when apt-get fails
  if ! { apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
           "${missing[@]}"; } > "$DIR/log/apt.log" 2>&1; then
    tail -n 30 "$DIR/log/apt.log" >&2
    fail "apt-get install ${missing[*]} failed (above; all of it in $DIR/log/apt.log)"
  fi
}

write_topology() {     # write_topology block|interleave
  local order=$1 r i members
  : > "$ETC/topology.conf.new"
  local leaves=()
  for ((r = 0; r < RACKS; r++)); do
    members=()
    for ((i = 1; i <= NODES; i++)); do
      if [ "$order" = interleave ]; then
        [ $(((i - 1) % RACKS)) = "$r" ] && members+=("n$i")
      else
        [ $(((i - 1) * RACKS / NODES)) = "$r" ] && members+=("n$i")
      fi
    done
    [ "${#members[@]}" -gt 0 ] || continue
    echo "SwitchName=rack$r Nodes=$(IFS=,; echo "${members[*]}")" >> "$ETC/topology.conf.new"
    leaves+=("rack$r")
  done
  echo "SwitchName=spine Switches=$(IFS=,; echo "${leaves[*]}")" >> "$ETC/topology.conf.new"
  mv "$ETC/topology.conf.new" "$ETC/topology.conf"
  echo "$order" > "$DIR/rack_order"
}

write_slurm_conf() {
  local i ctl
  ctl=$(hostname -s)    # slurmctld only starts when SlurmctldHost is this machine's short name
  mkdir -p "$ETC" "$DIR/state" "$DIR/log" "$DIR/tmp"
  chown slurm:slurm "$DIR/state" "$DIR/log"
  {
    echo "$MARK: generated by scripts/local_slurm_cluster.sh"
    # (unquoted: $DIR and $ctl expand here, and so would a backquote: none in this text)
    cat <<EOF
ClusterName=llama31ci
SlurmctldHost=$ctl(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
# each fake node bind-mounts its own directory here (private mount namespace)
TmpFS=$DIR/tmp
# no cgroups without systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
TopologyPlugin=topology/tree
# fake nodes may declare more CPUs/memory than the machine has
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# a finished job leaves squeue after 5 s, so 'sbatch --wait' returns promptly
MinJobAge=5
# SIGTERM -> SIGKILL in 10 s, as strict as sites set it (Slurm's default is 30 s): the fault
# tests (tests/test_slurm.py) check that a cancelled run still ends its log with run_stop
KillWait=10
InactiveLimit=0
SlurmctldDebug=info
SlurmdDebug=info
EOF
    for ((i = 1; i <= NODES; i++)); do
      echo "NodeName=n$i NodeAddr=127.0.10.$i Port=$((PORT0 + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } > "$ETC/slurm.conf"
  rm -f "$ETC/gres.conf"
  # node names must resolve on every fake node (MASTER_ADDR=n1): one loopback address each
  { grep -v "$MARK\$" /etc/hosts || true
    for ((i = 1; i <= NODES; i++)); do echo "127.0.10.$i n$i $MARK"; done; } > "$DIR/hosts"
  cat "$DIR/hosts" > /etc/hosts          # in place: /etc/hosts may be a bind mount
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey -c -k /etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
      cp /run/munge/munged.pid "$DIR/munged.pid"    # ours: `down` stops it
      return 0
    fi
    sleep 0.1
  done
  fail "munged did not start"
}

start_node() {         # start_node NAME: slurmd with its own hostname and /tmp-like TmpFS
  local n=$1
  mkdir -p "$DIR/spool/$n" "$DIR/tmp-$n"
  unshare --uts --mount --propagation private sh -c \
    "hostname $n && mount --bind '$DIR/tmp-$n' '$DIR/tmp' && exec /usr/sbin/slurmd -N $n" \
    || fail "cannot start slurmd for $n (unshare needs root and CAP_SYS_ADMIN)"
}

wait_nodes_idle() {
  local t0=$SECONDS n
  while :; do
    n=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$n" -ge "$NODES" ] && return 0
    if [ $((SECONDS - t0)) -gt 60 ]; then
      sinfo -N -l >&2 || true
      tail -n 20 "$DIR"/log/*.log >&2 || true
      fail "only $n of $NODES nodes idle after 60 s"
    fi
    sleep 0.3
  done
}

down() {
  local f pidfiles=()
  if running "$DIR/slurmctld.pid"; then
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  for f in "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/munged.pid"; do
    if [ -e "$f" ]; then pidfiles+=("$f"); fi
  done
  if [ "${#pidfiles[@]}" -gt 0 ]; then stop_by_pidfile "${pidfiles[@]}"; fi
  for f in "$DIR"/mntns-*; do if [ -e "$f" ]; then kill_node_leftovers "$f"; fi; done
  if grep -q "$MARK\$" /etc/hosts 2>/dev/null; then
    grep -v "$MARK\$" /etc/hosts > "$DIR/hosts" || true
    cat "$DIR/hosts" > /etc/hosts
  fi
  say "down"
}

live_shape() {         # "NODES RACKS ORDER" of the cluster that is up; '' when none (or broken)
  local n f
  running "$DIR/slurmctld.pid" || return 0
  for n in $(sed -n 's/^NodeName=\(n[0-9]*\) .*/\1/p' "$ETC/slurm.conf" 2>/dev/null); do
    running "$DIR/slurmd-$n.pid" || return 0
  done
  f=$(grep -c '^NodeName=' "$ETC/slurm.conf" 2>/dev/null) || return 0
  echo "$f $(grep -c '^SwitchName=rack' "$ETC/topology.conf" 2>/dev/null) $(cat "$DIR/rack_order" 2>/dev/null)"
}

up() {
  local t0=$SECONDS n shape
  [ "$(id -u)" = 0 ] || fail "must run as root (daemons, namespaces, /etc/slurm)"
  mkdir -p "$DIR"
  # a live cluster of the asked shape stays up, its jobs untouched (another order of the same
  # racks is re-wired); any other shape, or a half-dead cluster, is restarted
  shape=$(live_shape)
  if [ "$shape" = "$NODES $RACKS $ORDER" ]; then
    say "already up: $NODES nodes, $RACKS racks ($ORDER); nothing done (\`$0 down\` first to restart)"
    return 0
  elif [ -n "$shape" ] && [ "${shape% *}" = "$NODES $RACKS" ]; then
    say "already up: $NODES nodes, $RACKS racks (${shape##* }); re-wiring the racks to $ORDER"
    racks "$ORDER"
    return 0
  elif [ -n "$shape" ]; then
    say "up with another shape (nodes racks order: $shape): restarting as $NODES $RACKS $ORDER"
  fi
  down
  install_packages
  rm -rf "$DIR/state" "$DIR/spool" "$DIR"/tmp-*
  write_slurm_conf
  write_topology "$ORDER"
  start_munge
  /usr/sbin/slurmctld || fail "slurmctld did not start (see $DIR/log/slurmctld.log)"
  for n in $(node_names); do start_node "$n"; done
  wait_nodes_idle
  for n in $(node_names); do readlink "/proc/$(cat "$DIR/slurmd-$n.pid")/ns/mnt" > "$DIR/mntns-$n"; done
  say "up in $((SECONDS - t0)) s: $NODES nodes, $RACKS racks ($ORDER)"
  sinfo -N -o '%N %T %c %m' >&2
}

racks() {              # racks block|interleave: re-wire the topology of a running cluster
  local order=${1:-}
  case "$order" in block|interleave) ;; *) fail "usage: $0 racks block|interleave" ;; esac
  running "$DIR/slurmctld.pid" || fail "the cluster is not up"
  write_topology "$order"
  scontrol reconfigure
  wait_nodes_idle
  say "racks: $order ($(tr '\n' ' ' < "$ETC/topology.conf"))"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  racks) racks "${2:-}" ;;
  status) sinfo -N -o '%N %T %c %m'; squeue; cat "$ETC/topology.conf" ;;
  missing) missing_packages ;;
  *) echo "usage: $0 up|down|racks block|interleave|status|missing" >&2; exit 2 ;;
esac
