#!/bin/bash
# One short CPU training start, as train/run.py execs it, timed in arms that alternate (bench/results/trainer-start.md).
#
#   bench/trainer_start.sh VENV VERIFIER DATA LAYERS N ARM=REMOTE_DIR...
#
# VENV: a cpu-profile venv (torch, speculators); VERIFIER, DATA: a verifier and its prepared dataset (hidden states
# of LAYERS, e.g. "1 2 3"); N rounds, each arm once a round, in the order given; each ARM's REMOTE_DIR holds the
# specops_host package it runs (a tree's remote/, or `git archive REF remote | tar -x -C DIR`). Prints one line a
# start: ARM wall user sys (seconds), the load average beside it; then each arm's medians and ranges.
set -euo pipefail
venv=$1 verifier=$2 data=$3 layers=$4 n=$5
shift 5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for round in $(seq "$n"); do
  for arm in "$@"; do
    name=${arm%%=*} remote=${arm#*=}
    run="$tmp/runs/$name"
    rm -rf "$run"
    # shellcheck disable=SC2086  # (LAYERS: one id a word)
    PYTHONPATH="$remote" COLUMNS=120 PYTHONUNBUFFERED=1 /usr/bin/time -o "$tmp/time" -f "%e %U %S" \
      "$venv/bin/python3" -m specops_host.train.hooked --cpu --speculator-type eagle3 --draft-vocab-size 128 \
      --epochs 4 --total-seq-len 512 --lr 5e-3 --num-workers 0 --on-missing raise --log-freq 1 \
      --draft-attn-impl sdpa --loss-implementation eager --max-steps 1 --logger tensorboard \
      --verifier-name-or-path "$verifier" --data-path "$data" --target-layer-ids $layers \
      --save-path "$run/checkpoints" --log-dir "$run/logs" --run-name r > "$tmp/log" 2>&1 \
      || { echo "$name (round $round) failed:"; tail -20 "$tmp/log"; exit 1; }
    echo "$name $(cat "$tmp/time") load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$tmp/starts.txt"
  done
done
python3 - "$tmp/starts.txt" <<'EOF'
import statistics
import sys

arms = {}
for line in open(sys.argv[1]):
    name, wall, user, sys_, _ = line.split()
    arms.setdefault(name, []).append((float(wall), float(user) + float(sys_)))
for name, v in arms.items():
    cpu, wall = [x[1] for x in v], [x[0] for x in v]
    print(f"{name}: CPU-s median {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}), "
          f"wall s median {statistics.median(wall):.2f} ({min(wall):.2f}-{max(wall):.2f}), {len(v)} starts")
EOF
