#!/usr/bin/env bash
# Pre-training on a Cloud TPU VM slice (v4/v5e/v5p, single host or pod), driven from your laptop.
#
# UNTESTED in this repository's CI (no TPU available); `DRY_RUN=1` prints every gcloud command
# instead of running it, which the test-suite does check.
#
# Usage (from the repository root):
#   export TPU_NAME=my-v4-32 ZONE=us-central2-b [PROJECT=my-project]
#   launch/tpu_vm.sh setup                 # copy this checkout to every worker, install deps
#                                          # into a Python >= 3.11 environment there
#   launch/tpu_vm.sh run --gin_file=gin_configs/runs/X.gin --model_dir=gs://BUCKET/runs/X \
#       [--gin.NAME=VALUE ...]             # start training on all workers (in the background)
#   launch/tpu_vm.sh logs                  # follow worker 0's log (WORKER=3 for another)
#   launch/tpu_vm.sh stop                  # stop the training processes started by `run`
#
# How a pod run works: a TPU slice with several hosts is driven by running THE SAME command on
# every worker (`gcloud ... ssh --worker=all`). On TPU VMs `jax.distributed.initialize()` (which
# the trainer calls when no --coordinator_address is given) finds the other hosts by itself, so
# no coordinator flags are needed. Each host feeds its local chips with its own shard of the
# data. The model_dir must be a gs:// path (or another filesystem every worker sees), because
# every host writes its shards of each checkpoint there.
#
# The Python environment: the stock TPU VM image (Ubuntu 22.04) has Python 3.10 as `python3`,
# and this package needs >= 3.11 (jax >= 0.7 ships for 3.11+ only, so pip there would install
# an old jax and then refuse the package). `setup` therefore uses the system python3 for one
# thing only, `pip install --user uv` (into ~/.local/bin), and `uv venv --python 3.11` (or
# $PYTHON_VERSION) creates ~/$REMOTE_DIR/.venv with a CPython 3.11 that uv downloads (a
# python-build-standalone build) when the image has none. ASSUMES the workers reach the
# internet (PyPI, and GitHub where uv fetches its Pythons), as installing JAX needs anyway.
# This package and its dependencies (`.[data,gcs,tpu]`: JAX with libtpu, seqio/TensorFlow for
# the input pipeline, gcsfs) are installed into that environment with `uv pip`, with the exact
# pins of $PINS (default constraints/tpu.txt, the environment the test suite runs in; PINS=
# installs the newest releases instead), and `run` starts the trainer with its python, never
# with python3.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME to the TPU VM name}"
: "${ZONE:?set ZONE to the TPU zone, e.g. us-central2-b}"
REMOTE_DIR="${REMOTE_DIR:-xlm_jax}"           # checkout location on each worker (under ~)
PINS="${PINS-constraints/tpu.txt}"            # constraint file of the install (empty: none)
PYTHON_VERSION="${PYTHON_VERSION:-3.11}"      # the workers' Python (>= 3.11: setup.py)
UV_SPEC="${UV_SPEC:-uv}"                      # pip spec for uv (our choice: the latest)
LOG_FILE="${LOG_FILE:-xlm_jax_train.log}"     # per-worker log (under ~)
PID_FILE="${PID_FILE:-xlm_jax_train.pid}"     # per-worker pid of the trainer (under ~)

if [[ ! "$PYTHON_VERSION" =~ ^3\.(1[1-9]|[2-9][0-9])$ ]]; then
  echo "tpu_vm.sh: PYTHON_VERSION must be 3.11 or newer (3.MINOR), got '$PYTHON_VERSION'" >&2
  exit 2
fi
VENV_PYTHON=".venv/bin/python"  # the environment's python, relative to ~/$REMOTE_DIR
UV="~/.local/bin/uv"            # where `pip install --user` puts uv's binary

GCLOUD=(gcloud compute tpus tpu-vm)
COMMON=(--zone="$ZONE")
if [[ -n "${PROJECT:-}" ]]; then COMMON+=(--project="$PROJECT"); fi

run() {  # run a local command, or print it when DRY_RUN is set
  if [[ -n "${DRY_RUN:-}" ]]; then
    printf '+'; printf ' %q' "$@"; echo
  else
    "$@"
  fi
}

on_workers() {  # on_workers WORKERS 'shell command': run a command over ssh on TPU workers
  run "${GCLOUD[@]}" ssh "$TPU_NAME" "${COMMON[@]}" --worker="$1" --command="$2"
}

cmd="${1:-}"
if [[ $# -gt 0 ]]; then shift; fi
case "$cmd" in
  setup)
    # 1) Pack this checkout (without .git and local environments) and copy it to all workers.
    archive="${TMPDIR:-/tmp}/xlm_jax_src.$$.tar.gz"
    run tar czf "$archive" --exclude=.git --exclude=.venv --exclude='*.pyc' .
    run "${GCLOUD[@]}" scp "$archive" "$TPU_NAME:xlm_jax_src.tar.gz" "${COMMON[@]}" --worker=all
    run rm -f "$archive"
    # 2) Unpack on every worker; install uv with the system python3 (its only use), create the
    #    Python $PYTHON_VERSION environment ~/$REMOTE_DIR/.venv (kept when setup runs again) and
    #    install into it this package with JAX and the TPU runtime, the data extra
    #    (seqio/TensorFlow for the input pipeline) and gcsfs, at the pins of $PINS (a file of
    #    the copied checkout); check that it imports both.
    on_workers all "set -e; mkdir -p ~/$REMOTE_DIR && tar xzf ~/xlm_jax_src.tar.gz -C ~/$REMOTE_DIR \
      && cd ~/$REMOTE_DIR && python3 -m pip install -q --user --no-warn-script-location -U '$UV_SPEC' \
      && $UV venv -q --allow-existing --python '$PYTHON_VERSION' .venv \
      && $UV pip install -q --python $VENV_PYTHON ${PINS:+-c '$PINS' }-e '.[data,gcs,tpu]' \
      && $VENV_PYTHON -c 'import platform, jax, xlm_jax; print(\"python\", platform.python_version(), \"jax\", jax.__version__, \"process\", jax.process_index(), \"devices\", jax.local_device_count(), jax.device_count())'"
    ;;
  run)
    if [[ $# -eq 0 ]]; then
      echo "tpu_vm.sh run: pass the trainer flags, e.g. --gin_file=gin_configs/runs/X.gin --model_dir=gs://BUCKET/runs/X" >&2
      exit 2
    fi
    # Quote the trainer flags once for the remote shell, then start the trainer with the
    # environment's python under nohup on every worker (an ssh disconnect must not kill a
    # multi-day run); remember its pid. A worker without the environment refuses.
    printf -v flags ' %q' "$@"
    on_workers all "set -e; cd ~/$REMOTE_DIR; [ -x $VENV_PYTHON ] || { echo \"\$(hostname): no ~/$REMOTE_DIR/$VENV_PYTHON, run 'launch/tpu_vm.sh setup' first\" >&2; exit 1; }; \
      { nohup $VENV_PYTHON -m xlm_jax.train$flags > ~/$LOG_FILE 2>&1 < /dev/null & echo \$! > ~/$PID_FILE; }; echo \"\$(hostname): started pid \$(cat ~/$PID_FILE), log ~/$LOG_FILE\""
    ;;
  logs)
    on_workers "${WORKER:-0}" "tail -n 100 -F ~/$LOG_FILE"
    ;;
  stop)
    # Stop exactly the processes `run` started (by pid): a leftover trainer keeps the TPU
    # chips locked and the next run fails with "TPU in use".
    on_workers all "if [ -f ~/$PID_FILE ]; then kill \$(cat ~/$PID_FILE) 2>/dev/null && echo \"\$(hostname): stopped\"; rm -f ~/$PID_FILE; fi"
    ;;
  *)
    sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
