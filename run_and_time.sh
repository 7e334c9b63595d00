#!/usr/bin/env bash
# run_and_time.sh: the MLPerf runs of one config, on a Slurm cluster or on this machine.
#
#   CONFIG=configs/config_GB200_2048x4x8xtp4pp8cp2.toml sbatch -N 2048 run_and_time.sh
#       (Slurm >= 23.11 with topology/block: add `--segment 16`, the nodes of one NVL72 rack,
#        so every rack's nodes come as one block; on 8-GPU nodes the nodes of one model-parallel
#        group; `launch env CONFIG` prints it as LAUNCH_NODES_PER_RACK. Older Slurm rejects the
#        option. Sites that constrain devices: add --gpus-per-node=4 (8 on 8-GPU nodes). Set -t
#        to cover NEXP runs.)
#   CONFIG=configs/tiny_cpu.toml ./run_and_time.sh          # no Slurm: torchrun or one process
#
# Variables (all but CONFIG optional; every default comes from the config):
#   CONFIG        config file (relative to the repository root, or to the image's WORKDIR with CONT)
#   LOGDIR        where result_<i>.txt go (default runs/<config>-<job id or timestamp>); checked
#                 first (a writable directory, 64 MB free); refused when it holds an earlier
#                 campaign's result_*/console_* files (never replaced) or another job holds its
#                 lock (docs/launch.md, "Folders and results")
#   NEXP          number of runs (default run.num_runs)
#   SEED_BASE     run i uses seed SEED_BASE + i (default run.seed_base; a config without one,
#                 like the GB200 configs, draws each run's seed from the system's entropy)
#   CONT          container image; steps then run through pyxis (--container-image) in a writable
#                 container (--container-writable --container-remap-root) with DATADIR:/data,
#                 CKPTDIR:/ckpt and LOGDIR:/logs mounted, the home directory not mounted, and the
#                 config's launch_env forced over the image's (--container-env)
#   DATADIR       dataset root (overrides data.data_dir)
#   CKPTDIR       checkpoint root (overrides checkpoint.ckpt_dir)
#   CLEAR_CACHES  auto (default: drop the page cache on a Slurm allocation's nodes where
#                 permitted; a local run keeps the machine's cache), 1 (required, locally too),
#                 0 (never)
#   PYTHON        interpreter outside a container (default .venv/bin/python, else python3)
#   PREFLIGHT=0   skip the pre-flight step (Slurm; on by default): placement of every rank and,
#                 on GB200, the multi-node NVLink fabric and IMEX channel of every node
#   VERIFY_DATA=0 skip the data verification step (on by default: once per job, before the runs,
#                 `python -m llama31_405b data verify CONFIG` checks the data against its manifest)
#   REHEARSE=1    before the pre-flight, rehearse the launch rank by rank on one node (fake
#                 process groups, meta-device model: groups, placement, memory, dataset index;
#                 `python -m llama31_405b rehearse`, docs/rehearsal.md); off by default
#   DRY_RUN=1     print the commands instead of running them
#   PROFILE=1     profile instead of the timed runs: after the pre-flight and the data
#                 verification, one step of the same ranks runs `python -m llama31_405b profile`
#                 (a few steps after the warm-up under torch.profiler, their breakdown next to
#                 the planner's; not an MLPerf run: no run_start, docs/profile.md) with the first
#                 run's seed, writing into LOGDIR (default out/profile/<config>-<job id>; in the
#                 container /logs); no cache dropping, no NEXP runs, no compliance check
#   PROFILE_ARGS  more `profile` options, e.g. "--steps 2 --ranks 0,5,17" (default: the
#                 command's: --skip 2 --baseline 3 --steps 3, replica 0 plus one rank per replica)
#
# Exit status (the summary at the end gives each run's outcome from its log: success, aborted
# with the logged reason, or no run_stop; and what the launcher reported about the run's
# processes, e.g. "launcher (torchrun): rank 1 (pid 4242) killed by SIGKILL first", read from
# the run's console, kept as LOGDIR/console_<i>.txt):
#   0  every run converged (run_stop status success after an evaluation at the target: the one
#      verdict of llama31_405b/mlperf/verdict.py) and its log passed the compliance check
#   1  a run did not converge (run_stop aborted: NaN, signal, lost rank, failed log write,
#      target not reached) or its log failed the compliance check, or the job was stopped by a
#      signal, or the data verification failed (no run started)
#   2  bad config or variables, a folder that cannot be used (LOGDIR, DATADIR, CKPTDIR, the
#      tokenizer), a LOGDIR with earlier results or in use, or a run refused its input (config,
#      checkpoint, data, device; the exit statuses of every command: docs/cli.md)
#   3  the pre-flight check failed (placement, environment or, on GB200, multi-node NVLink:
#      retrying the same nodes is pointless)
#   4  a run's log has no run_stop: the run was killed (SIGKILL, OOM, node failure) or wrote no log
# With PROFILE=1: 0 the profile and its analysis were written, 1 the run or the analysis failed,
# 2 bad config, variables or profile options, 3 the pre-flight check failed.
#
#SBATCH --job-name=llama31_405b
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

die() { echo "run_and_time.sh: $*" >&2; exit 2; }
say() { echo "[run_and_time $(date -u +%H:%M:%S)] $*" >&2; }

[ -n "${CONFIG:-}" ] || die "set CONFIG=configs/<file>.toml (see the header of run_and_time.sh)"
if [ -n "${NEXP:-}" ] && ! [[ "$NEXP" =~ ^0*[1-9][0-9]*$ ]]; then
  die "NEXP=$NEXP: the number of runs must be a whole number >= 1 (unset: run.num_runs)"
fi

# --- where the code is: sbatch runs a spooled copy of this file, so fall back to the submit dir
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -d "$here/llama31_405b" ]; then REPO=$here
elif [ -n "${SLURM_SUBMIT_DIR:-}" ] && [ -d "$SLURM_SUBMIT_DIR/llama31_405b" ]; then REPO=$SLURM_SUBMIT_DIR
else die "cannot find the repository: submit from its root (sbatch run_and_time.sh there)"; fi
cd "$REPO"

IN_SLURM=0; [ -n "${SLURM_JOB_ID:-}" ] && IN_SLURM=1
DRY=${DRY_RUN:-0}
CONT=${CONT:-}
CONT_WORKDIR=${CONT_WORKDIR:-/workspace/llama31_405b}
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
# outside a container the checkout is the code; inside one the image's copy is (a host
# PYTHONPATH reaching the container could import a different checkout)
[ -n "$CONT" ] || export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
PROFILE=${PROFILE:-0}
case "$PROFILE" in 0|1) ;; *) die "PROFILE=$PROFILE: set PROFILE=1 to profile, or leave it unset" ;; esac
read -r -a PROFILE_OPTS <<< "${PROFILE_ARGS:-}"
[ "$PROFILE" = 1 ] || [ "${#PROFILE_OPTS[@]}" = 0 ] || die "PROFILE_ARGS is set but PROFILE is not 1"
# a profile folder is not a runs folder (compliance check refuses it and anything above it)
[ "$PROFILE" = 1 ] && logs_root=out/profile || logs_root=runs
LOGDIR=${LOGDIR:-$REPO/$logs_root/$(basename "$CONFIG" .toml)-${SLURM_JOB_ID:-$(date -u +%Y%m%d-%H%M%S)}}

# --- the log folder, before anything that costs: the one folder the job writes. Then the lock
# (one campaign per LOGDIR at a time) and the earlier results (never replaced): docs/launch.md,
# "Folders and results" ----------------------------------------------------------------------
cause() { local m=${1##*: }; echo "${m,,}"; }     # a failed shell command's cause, lower case
LOGDIR_MIN_MB=64    # the logs of NEXP runs: MLPerf logs, consoles, compliance verdicts
[ ! -e "$LOGDIR" ] || [ -d "$LOGDIR" ] \
  || die "LOGDIR=$LOGDIR: not a directory (a file is in the way); choose another LOGDIR"
err=$(mkdir -p -- "$LOGDIR" 2>&1) \
  || die "LOGDIR=$LOGDIR: cannot be created ($(cause "$err")); choose another LOGDIR"
LOGDIR=$(cd "$LOGDIR" && pwd)
probe=$LOGDIR/.write-test.$$
err=$( { : > "$probe"; } 2>&1 ) \
  || die "LOGDIR=$LOGDIR: not writable ($(cause "$err")); choose another LOGDIR"
rm -f -- "$probe"
free_kb=$(df -Pk -- "$LOGDIR" 2>/dev/null | awk 'NR == 2 {print $4}') || free_kb=
[ -z "$free_kb" ] || [ "$free_kb" -ge $((LOGDIR_MIN_MB * 1024)) ] \
  || die "LOGDIR=$LOGDIR: $((free_kb / 1024)) MB free, the runs' logs need $LOGDIR_MIN_MB MB;" \
         "free some space or choose another LOGDIR"
# the lock: held (flock, on fd 9, inherited by every step) while this script or any process it
# started lives; the kernel drops it when the last of them ends, so a dead holder leaves none.
# The file stays (removing it would let two holders lock two files); it names its last holder.
LOCK=$LOGDIR/.run_and_time.lock
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$LOCK" || die "LOGDIR=$LOGDIR: cannot open its lock file $LOCK; choose another LOGDIR"
  lrc=0; flock -n -E 75 9 || lrc=$?
  if [ "$lrc" = 75 ]; then
    die "LOGDIR=$LOGDIR: in use by another run_and_time.sh ($(head -c 300 "$LOCK" 2>/dev/null ||
         true)); wait for it to end, or choose another LOGDIR"
  elif [ "$lrc" != 0 ]; then
    say "warning: LOGDIR=$LOGDIR: its filesystem takes no flock lock: a second job given the" \
        "same LOGDIR at once would not be refused"
  else
    printf 'job %s, host %s, pid %s, since %s UTC' "${SLURM_JOB_ID:-none (local)}" \
      "$(uname -n)" "$$" "$(date -u '+%Y-%m-%d %H:%M:%S')" > "$LOCK"
  fi
else
  say "warning: no flock command (util-linux): a second job given the same LOGDIR at once" \
      "would not be refused"
fi
shopt -s nullglob
# (and an earlier profile's: with PROFILE=1 the LOGDIR is the profile folder, which `profile`
# claims whole; a calibration may name the earlier one as its source)
# (each a glob, [x] included, so that nullglob drops what is not there)
earlier=("$LOGDIR"/result_*.txt "$LOGDIR"/console_*.txt "$LOGDIR"/*.compliance*.log
         "$LOGDIR"/profile.jso[n] "$LOGDIR"/NOT_AN_MLPERF_RUN.tx[t] "$LOGDIR"/analysis*.json
         "$LOGDIR"/rank[s] "$LOGDIR"/trace[s])
shopt -u nullglob
if [ "${#earlier[@]}" -gt 0 ]; then
  names=$(for f in "${earlier[@]}"; do basename "$f"; done | sort | head -n 8 | paste -sd ' ')
  [ "${#earlier[@]}" -le 8 ] || names="$names ..."
  die "LOGDIR=$LOGDIR already holds an earlier campaign's files ($names), kept: a result is" \
      "never replaced; choose a new LOGDIR (unset: a fresh runs/<config>-<job id>), or move" \
      "those files away first"
fi

run() {          # run CMD...: execute, or print it under DRY_RUN=1
  if [ "$DRY" = 1 ]; then { printf '+'; printf ' %q' "$@"; printf '\n'; } >&2; return 0; fi
  "$@"
}

# --- container (pyxis) arguments and the paths the training process sees --------------------
SETS=()          # --set overrides passed to every python command
CONT_ARGS=()
if [ -n "$CONT" ]; then
  [ "$IN_SLURM" = 1 ] || die "CONT needs a Slurm job with pyxis; without Slurm, run inside the container"
  mounts="$LOGDIR:/logs"
  if [ -n "${DATADIR:-}" ]; then mounts="$DATADIR:/data,$mounts"; SETS+=(--set data.data_dir=/data); fi
  if [ -n "${CKPTDIR:-}" ]; then mounts="$CKPTDIR:/ckpt,$mounts"; SETS+=(--set checkpoint.ckpt_dir=/ckpt); fi
  # one named container per job: created by the first step on each node, reused by every later
  # step (all NEXP runs use the same container); no home mount, so no ~/.local site-packages
  # or shell rc files of the submitting user leak into the runs. Writable (as root inside, mapped
  # to the submitting user outside): Triton/TorchInductor (Megatron's jit_fuser is torch.compile),
  # CUDA's kernel cache and matplotlib write files at run time; the config's run.cache_dir points
  # them at one directory of that container (config/env.py)
  CONT_ARGS=(--container-image="$CONT" --container-name=llama31_405b
             --container-mounts="$mounts" --container-workdir="$CONT_WORKDIR"
             --container-writable --container-remap-root --no-container-mount-home)
  STEP_PY=python; STEP_LOGDIR=/logs
else
  [ -z "${DATADIR:-}" ] || SETS+=(--set "data.data_dir=$DATADIR")
  [ -z "${CKPTDIR:-}" ] || SETS+=(--set "checkpoint.ckpt_dir=$CKPTDIR")
  STEP_PY=$PYTHON; STEP_LOGDIR=$LOGDIR
fi

py_step() {      # py_step ARGS...: `python -m llama31_405b ARGS` as one task of the job (in the
                 # container with CONT); printed instead under DRY_RUN=1
  if [ -n "$CONT" ]; then run srun --nodes=1 --ntasks=1 "${CONT_ARGS[@]}" python -m llama31_405b "$@"
  else run "$PYTHON" -m llama31_405b "$@"; fi
}

hostnames() {    # hostnames NODELIST: one host per line; without Slurm's scontrol (a machine or
                 # container without Slurm's tools) the project's own expansion of the expression
  if command -v scontrol >/dev/null 2>&1; then scontrol show hostnames "$1"
  else "$PYTHON" -m llama31_405b launch hostnames "$1"; fi
}
hostlist() {     # hostlist HOST,...: the hostlist expression of these hosts
  if command -v scontrol >/dev/null 2>&1; then scontrol show hostlist "$1"
  else "$PYTHON" -m llama31_405b launch hostlist "$1"; fi
}

py() {           # py ARGS...: `python -m llama31_405b ARGS` where the training code lives
  if [ -n "$CONT" ] && [ "$DRY" != 1 ]; then
    srun --nodes=1 --ntasks=1 "${CONT_ARGS[@]}" python -m llama31_405b "$@"
  else
    "$PYTHON" -m llama31_405b "$@"
  fi
}

# --- the launch plan: every number below comes from the config, via one Python helper -------
plan_args=(launch env "$CONFIG" "${SETS[@]}")
# the data folder, the tokenizer and the checkpoint folder, readable? Checked here on the host
# (without a container: `launch env --check-dirs`; with one, DATADIR and CKPTDIR, the host
# folders the container mounts, just below); not under DRY_RUN, which may name paths of another
# machine
if [ -n "$CONT" ] && [ "$DRY" != 1 ]; then
  for var in DATADIR CKPTDIR; do
    path=${!var:-}
    [ -n "$path" ] || continue
    [ -e "$path" ] || die "$var=$path: no such directory; set $var to the folder to mount"
    [ -d "$path" ] || die "$var=$path: not a directory; set $var to the folder to mount"
    { [ -r "$path" ] && [ -x "$path" ]; } \
      || die "$var=$path: not readable (permission denied); set $var to a readable folder"
  done
elif [ "$DRY" != 1 ]; then
  plan_args+=(--check-dirs)
fi
if [ "$PROFILE" = 1 ]; then plan_args+=(--runs 1)     # one profile, with the first run's seed
elif [ -n "${NEXP:-}" ]; then plan_args+=(--runs "$NEXP"); fi
[ -z "${SEED_BASE:-}" ] || plan_args+=(--seed-base "$SEED_BASE")
plan=$(py "${plan_args[@]}") || die "launch plan failed for CONFIG=$CONFIG (message above)"
eval "$plan"     # LAUNCH_* variables and `export` of the config's launch_env

if [ "$IN_SLURM" = 1 ]; then
  have=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-0}}
  if [ "$have" -lt "$LAUNCH_NODES" ]; then
    die "the job has $have node(s), $CONFIG needs $LAUNCH_NODES: sbatch -N $LAUNCH_NODES run_and_time.sh"
  elif [ "$have" -gt "$LAUNCH_NODES" ]; then
    say "warning: the job has $have nodes, the runs use the first $LAUNCH_NODES"
  fi
elif [ -n "$LAUNCH_LOCAL_ERROR" ]; then
  die "$LAUNCH_LOCAL_ERROR"
fi
# the allocation first (a wrong -N says the right one), then the folders (still before any step)
[ -z "${LAUNCH_DIRS_ERROR:-}" ] || die "$LAUNCH_DIRS_ERROR"

# --- Slurm steps: the nodes, the rendezvous host, CPUs per task, the container's environment ---
STEP_NODES=()    # every multi-node step: --nodelist, when the job has spare nodes
RANK_CPUS=()     # the steps with one task per GPU: --cpus-per-task
if [ "$IN_SLURM" = 1 ]; then
  [ -n "${SLURM_JOB_NODELIST:-}" ] || die "SLURM_JOB_NODELIST is not set: run under sbatch/salloc"
  expanded=$(hostnames "$SLURM_JOB_NODELIST") \
    || die "cannot expand SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST (message above)"
  mapfile -t hosts <<< "$expanded"
  [ "${#hosts[@]}" -ge "$LAUNCH_NODES" ] \
    || die "SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST has ${#hosts[@]} host(s), need $LAUNCH_NODES"
  hosts=("${hosts[@]:0:$LAUNCH_NODES}")
  # rank 0 runs on the first node of every step; the tasks (in the container, where scontrol
  # usually is not) take the rendezvous host from here. The port stays per step (distributed.py).
  export MASTER_ADDR=${hosts[0]}
  if [ "$have" -gt "$LAUNCH_NODES" ]; then
    STEP_NODES=(--nodelist="$(hostlist "$(IFS=,; echo "${hosts[*]}")")")
  fi
  # Slurm gives each task 1 CPU unless told otherwise (srun does not inherit sbatch's
  # --cpus-per-task since 22.05): give each rank its share of the node, so task i is bound to
  # the cores (on GB200: the Grace socket) next to GPU i
  cpt=$(( ${SLURM_CPUS_ON_NODE:-0} / LAUNCH_TASKS_PER_NODE ))
  [ "$cpt" -ge 1 ] && RANK_CPUS=(--cpus-per-task="$cpt")
  if [ "$LAUNCH_DEVICE" = gpu ] && [ -z "${SLURM_GPUS_ON_NODE:-}${SLURM_JOB_GPUS:-}" ]; then
    say "note: the job requested no GPUs; where Slurm constrains devices the ranks see none" \
        "(the pre-flight then fails): sbatch --gpus-per-node=$LAUNCH_TASKS_PER_NODE"
  fi
  if [ -n "$CONT" ]; then
    names=$(IFS=,; echo "MASTER_ADDR${LAUNCH_ENV_NAMES[*]:+,${LAUNCH_ENV_NAMES[*]}}")
    CONT_ARGS+=(--container-env="$names")
  fi
fi
say "config $CONFIG: $LAUNCH_WORLD_SIZE rank(s) on $LAUNCH_NODES node(s) x $LAUNCH_TASKS_PER_NODE" \
    "($LAUNCH_DEVICE), runs with seeds ${LAUNCH_SEEDS[*]}, logs in $LOGDIR" \
    "$([ "$IN_SLURM" = 1 ] && echo "(Slurm job $SLURM_JOB_ID)" || echo "(local)")"

# --- page cache: dropped before each run where the node lets us ------------------------------
clear_caches() {  # prints true or false
  local mode=${CLEAR_CACHES:-auto} ok=false
  case "$mode" in 0|no|false) echo false; return 0 ;; esac
  # auto drops it on a Slurm allocation's nodes only: a local run (a laptop, a shared
  # workstation, root or not) keeps the machine's page cache unless CLEAR_CACHES=1 asks
  if [ "$mode" = auto ] && [ "$IN_SLURM" != 1 ]; then echo false; return 0; fi
  # on the host, never in the container; root writes the sysctl, others may have a sudo rule
  local drop='sync; { echo 3 > /proc/sys/vm/drop_caches || sudo -n sysctl -q vm.drop_caches=3; } 2>/dev/null'
  if [ "$IN_SLURM" = 1 ]; then
    run srun --quiet --nodes="$LAUNCH_NODES" --ntasks="$LAUNCH_NODES" --ntasks-per-node=1 \
      "${STEP_NODES[@]}" bash -c "$drop" && ok=true
  else
    run bash -c "$drop" && ok=true
  fi
  if [ "$DRY" = 1 ]; then echo dry-run; return 0; fi
  if [ "$ok" = false ] && [ "$mode" = 1 ]; then die "CLEAR_CACHES=1 but the page cache cannot be dropped here"; fi
  echo "$ok"
}

# --- the run's console for the user: the launcher's and the ranks' tracebacks and C++ frames
# folded (torchrun's ChildFailedError and SignalException, which the outcome line reports, gone;
# of any other traceback its last line kept); console_<i>.txt keeps every line -----------------
AWK_OPTS=()
if awk -W interactive 'BEGIN {}' </dev/null >/dev/null 2>&1; then AWK_OPTS=(-W interactive); fi
fold_console() {  # fold_console FILE: stdin to stdout, folded; FILE named in the closing note
  if [ -r "$REPO/scripts/fold_console.awk" ]; then
    awk "${AWK_OPTS[@]}" -v file="$1" -f "$REPO/scripts/fold_console.awk"
  else cat; fi
}

ABORT=0
trap 'ABORT=1; say "signal received: stopping after the current run"' TERM INT

# every rank's interpreter (`train` and `profile` alike): srun starts one task per rank, torchrun
# one process per rank on this machine, or one process
rank_py=("$STEP_PY")
if [ "$IN_SLURM" = 1 ]; then
  launcher=(srun --nodes="$LAUNCH_NODES" --ntasks="$LAUNCH_WORLD_SIZE"
            --ntasks-per-node="$LAUNCH_TASKS_PER_NODE" "${STEP_NODES[@]}" "${RANK_CPUS[@]}" --kill-on-bad-exit=1
            "${CONT_ARGS[@]}")
elif [ "$LAUNCH_WORLD_SIZE" -gt 1 ]; then
  rank_py=("$STEP_PY" -m torch.distributed.run --standalone --nproc-per-node="$LAUNCH_WORLD_SIZE")
  launcher=()
else
  launcher=()
fi
train_cmd=("${rank_py[@]}" -m llama31_405b train --config "$CONFIG" "${SETS[@]}")

# --- pre-flight (Slurm): the checks of `train`'s start alone (placement; on GPU the launch_env;
# on GB200 the NVLink fabric and IMEX channel of every node), before any run, so a bad allocation
# stops the job with exit 3 (train repeats the check; this one costs no run) ---------------------
if [ "${REHEARSE:-0}" = 1 ]; then   # opt-in: minutes on one node, no GPU used
  rc=0
  run py rehearse "$CONFIG" "${SETS[@]}" || rc=$?
  if [ "$rc" != 0 ]; then
    say "FAILED: rehearsal exited $rc; no run was started"
    case "$rc" in 2|3) exit "$rc" ;; *) exit 1 ;; esac
  fi
fi
if [ "$IN_SLURM" = 1 ] && [ "${PREFLIGHT:-1}" = 1 ]; then
  rc=0
  # 600 s for all ranks to join: on hundreds of nodes the container starts are minutes apart.
  # The ranks send their placement to rank 0 over plain TCP (parallel/gather.py): no torch
  # import and no process group on any rank.
  run srun --nodes="$LAUNCH_NODES" --ntasks="$LAUNCH_WORLD_SIZE" \
    --ntasks-per-node="$LAUNCH_TASKS_PER_NODE" "${STEP_NODES[@]}" "${RANK_CPUS[@]}" \
    "${CONT_ARGS[@]}" \
    "$STEP_PY" -m llama31_405b launch preflight --config "$CONFIG" --timeout 600 "${SETS[@]}" || rc=$?
  if [ "$rc" != 0 ]; then
    say "FAILED: pre-flight check exited $rc; no run was started"
    [ "$rc" = 3 ] && exit 3
    exit 1
  fi
fi

# --- data verification: once per job, before the timed runs. It reads the .bin files against the
# data's manifest (docs/data.md); the runs rely on its verdict instead of reading the dataset
# themselves, so no run touches the dataset before its run_start ------------------------------
if [ "${VERIFY_DATA:-1}" = 1 ]; then
  say "verifying the data of $CONFIG against its manifest (once for all runs)"
  rc=0
  py_step data verify "$CONFIG" "${SETS[@]}" || rc=$?
  if [ "$rc" != 0 ]; then
    say "FAILED: data verification exited $rc (message above); no run was started." \
        "Check DATADIR / data.data_dir, then rebuild or re-verify the data" \
        "(python -m llama31_405b data prepare / data verify CONFIG; see docs/data.md)"
    exit 1
  fi
fi

# --- PROFILE=1: the same ranks, launched as a run's, run `profile` once instead of the runs ----
if [ "$PROFILE" = 1 ]; then
  say "profile: $LAUNCH_WORLD_SIZE rank(s), seed ${LAUNCH_SEEDS[0]}, into $LOGDIR" \
      "(not an MLPerf run: no run_start, no cache dropping, no compliance check)"
  rc=0
  run "${launcher[@]}" "${rank_py[@]}" -m llama31_405b profile "$CONFIG" "${SETS[@]}" \
    --out "$STEP_LOGDIR" --seed "${LAUNCH_SEEDS[0]}" "${PROFILE_OPTS[@]}" || rc=$?
  if [ "$DRY" = 1 ]; then say "dry run: nothing was executed"; exit 0; fi
  if [ "$rc" = 0 ]; then
    say "profile done: $LOGDIR/analysis.txt, analysis.json, breakdown.png; traces in $LOGDIR/traces"
    exit 0
  fi
  say "FAILED: profile exited $rc (messages above)"
  [ "$rc" = 2 ] && exit 2
  exit 1
fi

failed=0; killed=0; summary=()
for i in "${!LAUNCH_SEEDS[@]}"; do
  seed=${LAUNCH_SEEDS[$i]}
  cleared=$(clear_caches)
  flags=(--seed "$seed" --mlperf-log "$STEP_LOGDIR/result_$i.txt")
  [ "$cleared" = true ] && flags+=(--cache-cleared)
  say "run $i: seed $seed, cache cleared: $cleared"
  if [ "$cleared" = false ] && [ "${CLEAR_CACHES:-auto}" = auto ] && [ "$i" = 0 ]; then
    if [ "$IN_SLURM" = 1 ]; then
      say "warning: the page cache could not be dropped (not root, no sudo rule for" \
          "'sysctl vm.drop_caches=3'): the logs record cache_clear false; for a submission run" \
          "where it can be dropped, or set CLEAR_CACHES=1 to refuse to run without it"
    else
      say "note: a local run keeps this machine's page cache (CLEAR_CACHES=auto drops it on" \
          "a Slurm allocation only): the logs record cache_clear false; CLEAR_CACHES=1 drops it here"
    fi
  fi
  t0=$SECONDS; rc=0
  # the run's console (its stderr and the launcher's) is kept as console_<i>.txt: the outcome
  # line adds what torchrun or srun reported about the run's processes (which task, how it ended)
  console=$LOGDIR/console_$i.txt
  if [ "$DRY" = 1 ]; then
    run "${launcher[@]}" "${train_cmd[@]}" "${flags[@]}" || rc=$?
  else
    # (tee and the fold ignore SIGTERM/SIGINT: on scancel they must outlive the run's last
    # lines, not break the pipe the run's stderr writes to; tee -p: should the fold end early,
    # the console file still gets every line)
    # the console is created exclusively (noclobber: O_EXCL), then only appended to: a console
    # another job created meanwhile is refused, never truncated
    ( set -C; : > "$console" ) 2>/dev/null \
      || die "$console exists (another job writing into LOGDIR=$LOGDIR?), kept: a result is" \
             "never replaced; choose a new LOGDIR"
    run "${launcher[@]}" "${train_cmd[@]}" "${flags[@]}" \
      2> >(trap '' TERM INT; tee -a -p "$console" | fold_console "$console" >&2) || rc=$?
    wait $! 2>/dev/null || true     # the tee has written everything (bash >= 4.4)
  fi
  say "run $i: train exited $rc after $((SECONDS - t0)) s"
  # --- the run's outcome, from its log: success, aborted (the logged reason) or no run_stop
  # (killed before it could log one); check-log exits 0 ok, 1 failed, 4 no run_stop
  verdict="DRY"; vrc=0
  if [ "$DRY" != 1 ]; then
    verdict=$(py launch check-log --config "$CONFIG" "${SETS[@]}" --require-success \
                --report-dir "$STEP_LOGDIR" --launcher-log "$STEP_LOGDIR/console_$i.txt" \
                "$STEP_LOGDIR/result_$i.txt") || vrc=$?
    [ -n "$verdict" ] || verdict="no verdict: launch check-log exited $vrc"
    case "$vrc" in 0|1|4) ;; *) vrc=1 ;; esac
    if [ "$rc" != 0 ] && [ "$vrc" = 0 ]; then vrc=1; fi   # a clean log, but train failed
  fi
  summary+=("run $i seed $seed: train exit $rc; $verdict")
  case "$vrc" in 4) killed=$((killed + 1)) ;; 1) failed=$((failed + 1)) ;; esac
  if [ "$rc" = 2 ] || [ "$rc" = 3 ]; then
    say "run $i: exit $rc (bad input: config, checkpoint, data, device; or placement, see" \
        "docs/cli.md): the remaining runs would fail the same way"
    break
  fi
  if [ "$ABORT" = 1 ]; then say "aborted by signal after run $i"; break; fi
done

say "summary ($LOGDIR):"
for line in "${summary[@]}"; do echo "  $line" >&2; done
done_runs=${#summary[@]}
if [ "$failed" -gt 0 ] || [ "$killed" -gt 0 ] || [ "$ABORT" = 1 ] \
   || [ "$done_runs" -lt "${#LAUNCH_SEEDS[@]}" ]; then
  say "FAILED: $failed run(s) aborted or not compliant, $killed run(s) without run_stop" \
      "(killed), $done_runs of ${#LAUNCH_SEEDS[@]} run(s) done"
  [ "${rc:-0}" = 3 ] && exit 3
  [ "${rc:-0}" = 2 ] && exit 2
  [ "$killed" -gt 0 ] && exit 4
  exit 1
fi
if [ "$DRY" = 1 ]; then say "dry run: nothing was executed"; exit 0; fi
say "all ${#LAUNCH_SEEDS[@]} run(s) succeeded and passed the compliance check"
