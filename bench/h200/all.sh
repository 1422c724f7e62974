#!/bin/bash
# The H200 bench, every step through specops with the `local` transport (run from the repo root
# on the GPU machine; started in the background by start.sh, collected by collect.sh):
#   setup      laptop-side venv /tmp/lap from the carried wheels (.whl/cuda-h200/laptop), hosts.yaml
#   bootstrap  inv bootstrap --wheelhouse .whl/cuda-h200   (top-up of the preinstalled /opt/torch/.venv)
#   check      inv check ; inv check --deep ; the train gate on the default config
#   verifier   random Llama-3.1-8B-sized verifier on the GPU (bench/h200/make_verifier_8b.py)
#   data       inv prepare-data (256 pre-tokenised rows x 1024) ; inv extract --backend hf ; inv inspect-data
#   quickcheck inv check (and on the two-node group where the machine has 2 GPUs)
#   train      inv train --nproc 1 (25 steps, no torchrun) ; the same flags by hand with `speculators train` ; tps.py
#   stop       inv train (long) ; inv stop mid-run ; process group and GPU memory before/after
#   deepall    inv check --deep --all (every fallback)
#   multi      (2 GPUs) inv train --nproc 2 (torchrun, 25 steps) ; the same by hand with torchrun ; tps.py
#   twonode    (2 GPUs) inv train --host @pair: two torchrun nodes (--nnodes 2, c10d on 127.0.0.1), one GPU
#              each ; tps.py ; inv status, logs --rank 1 ; inv stop --host @pair mid-run ; GPU memory
#   resume2    (2 GPUs) inv train --host @pair --epochs 1, then the same run id --epochs 2 (a resume)
set -u
STAGES=${*:-setup bootstrap check verifier data train stop deepall}  # 2 GPUs: ... train multi twonode
# (overridable, for a CPU rehearsal: VPY=/tmp/exist/bin/python3 PROFILE=cpu WHL=... CONFIG=configs/demo.yaml)
B=${B:-/tmp/h200-bench}
VPY=${VPY:-/opt/torch/.venv/bin/python3}
VENV=$(dirname "$(dirname "$VPY")")
PROFILE=${PROFILE:-cuda}
WHL=${WHL:-.whl/cuda-h200}
CONFIG=${CONFIG:-bench/h200/eagle3-h200.yaml}
WD=${WD:-/tmp/specops-h200}
VER=$WD/models/llama8b-random
ROWS=${ROWS:-256}
TOKENS=${TOKENS:-1024}
LAP=${LAP:-}  # (a rehearsal may name an existing laptop venv; else one is made at /tmp/lap)
INV=${LAP:-/tmp/lap}/bin/inv
STEPS=${STEPS:-25}
NG=${NG:-$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")}
mkdir -p "$B"
export SPECOPS_HOSTS=$B/hosts.yaml SPECOPS_HOST=local PYTHONUNBUFFERED=1 COLUMNS=160 CI=1
# NVLink multicast stays off on the device machines (KINDS.md); one inductor/triton cache for every
# run (by hand too), so only the first run of a graph pays its compile
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR=$B/cache/inductor TRITON_CACHE_DIR=$B/cache/triton
say() { echo "[$(date +%T)] $*" | tee -a "$B/summary.txt"; }
# live processes carrying a job's tag (SPECOPS_JOB=<tag> in their environment: ranks in sessions of their own too)
alive_tagged() { local n=0 p; for p in $(grep -lZ -a "SPECOPS_JOB=$1" /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | cut -d/ -f3); do [[ "$(ps -o stat= -p "$p" 2>/dev/null)" == Z* || -z "$(ps -o stat= -p "$p" 2>/dev/null)" ]] || n=$((n + 1)); done; echo $n; }
alive_in_group() { local n=0 p; for p in $(pgrep -g "$1"); do [[ "$(ps -o stat= -p "$p")" == Z* ]] || n=$((n + 1)); done; echo $n; }
gpu_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | paste -sd/ || echo n/a; }
run_stage() {
  local name=$1; shift
  say "== $name: start"
  local t0=$(date +%s)
  ( set -x; "$@" ) > "$B/$name.log" 2>&1
  local rc=$?
  say "== $name: rc=$rc in $(( $(date +%s) - t0 ))s"
  return $rc
}

s_setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  if [ -z "$LAP" ]; then
    rm -rf /tmp/lap
    $VPY -m venv --without-pip /tmp/lap
    $VPY -m pip --python /tmp/lap/bin/python3 install -q --no-index --no-deps "$WHL"/laptop/*.whl || return 1
  fi
  cat > "$B/hosts.yaml" <<EOF
hosts:
  local:
    transport: local
    profile: $PROFILE
    venv: $VENV
    venv_existing: true
    workdir: $WD
    verifier: $VER
EOF
  [ "$PROFILE" = cuda ] && echo "    gpus: ${NG:-1}" >> "$B/hosts.yaml"
  if [ "${NG:-1}" -ge 2 ]; then  # two nodes on one box: own workdir and GPU each, rendezvous on loopback
    for i in 0 1; do printf '%s\n' "  n$i:" "    transport: local" "    address: 127.0.0.1" "    profile: $PROFILE" \
      "    venv: $VENV" "    venv_existing: true" "    workdir: $WD-n$i" "    verifier: $VER" "    gpus: 1" \
      "    env: {CUDA_VISIBLE_DEVICES: \"$i\"}" >> "$B/hosts.yaml"; done
    printf 'groups:\n  pair: [n0, n1]\n' >> "$B/hosts.yaml"
  fi
  cat "$B/hosts.yaml"
  $INV hosts
}

s_bootstrap() {
  $VPY -m pip list --format=freeze > "$B/freeze-before.txt"
  $INV bootstrap --wheelhouse "$WHL" --dry-run
  $INV bootstrap --wheelhouse "$WHL" || return 1
  $INV bootstrap --wheelhouse "$WHL"          # again: verifies only
  $VPY -m pip list --format=freeze > "$B/freeze-after.txt"
  if [ "${NG:-1}" -ge 2 ]; then $INV bootstrap --host @pair --wheelhouse "$WHL" || return 1; fi
  diff "$B/freeze-before.txt" "$B/freeze-after.txt"
  cat "$WD/.specops/env-$PROFILE.txt"
  true
}

s_check() {
  $INV check
  echo "inv check rc=$?"
  $INV check --deep
  echo "inv check --deep rc=$?"
  cat "$WD/.specops/deep-check.json"
  # the train gate (specops.ops.check.refuse_failed_settings) on the default config and on the bench config
  ${LAP:-/tmp/lap}/bin/python3 - <<'EOF'
from specops import config, inventory
from specops.ops import check
from specops.errors import SpecopsError
from specops.host.connection import connect
h = inventory.load(None).get("local")
with connect(h) as t:
    for cfg in (None, "bench/h200/eagle3-h200.yaml"):
        flags = config.load_config(cfg, h.profile, {})["flags"]
        try:
            check.refuse_failed_settings(t, flags)
            print(f"gate {cfg or 'configs/eagle3.yaml'}: allowed")
        except SpecopsError as e:
            print(f"gate {cfg or 'configs/eagle3.yaml'}: {e}")
EOF
  true
}

s_verifier() {
  df -h /tmp | tail -1
  if [ "$PROFILE" = cuda ]; then $VPY bench/h200/make_verifier_8b.py "$VER" || return 1
  else $INV make-verifier --path "$VER" || return 1; fi
  ls -la "$VER"; df -h /tmp | tail -1
}

s_data() {
  if [ "$PROFILE" = cuda ]; then $VPY bench/h200/make_rows.py "$B/rows.jsonl" --rows "$ROWS" --tokens "$TOKENS"
  else $VPY bench/h200/make_rows.py "$B/rows.jsonl" --rows "$ROWS" --tokens "$TOKENS" --vocab 1000; fi
  $INV prepare-data --data "$B/rows.jsonl" --seq-length 2048 || return 1
  $INV extract --backend hf ${LAYERS:+--layers "$LAYERS"} || return 1
  $INV inspect-data
  du -sh "$WD/data/default"; df -h /tmp | tail -1
}

source "$(dirname "$0")/hand.sh"  # by_hand RUN OUT [NPROC]

s_quickcheck() {
  $INV check
  echo "inv check rc=$?"
  if [ "${NG:-1}" -ge 2 ]; then $INV check --host @pair; echo "inv check --host @pair rc=$?"; fi
  true
}

s_train() {
  echo "gpu memory before: $(gpu_mem) MiB"
  rm -rf "$WD/runs/h200-specops"
  $INV train --config "$CONFIG" --run-id h200-specops --max-steps "$STEPS" --nproc 1 --follow || return 1
  by_hand h200-specops "$B/hand"
  $VPY bench/h200/tps.py --warmup 5 specops="$WD/runs/h200-specops/output.log" by_hand="$B/hand/output.log" \
    | tee "$B/tps.json"
  say "1 GPU: $(grep -A3 '"ratio"' "$B/tps.json" | tr -d '\n ')"
}

s_multi() {
  [ "${NG:-1}" -ge 2 ] || { echo "needs 2 GPUs (have ${NG:-0})"; return 1; }
  echo "gpu memory before: $(gpu_mem) MiB"
  rm -rf "$WD/runs/h200-nproc2"
  $INV train --config "$CONFIG" --run-id h200-nproc2 --max-steps "$STEPS" --nproc 2 --follow || return 1
  by_hand h200-nproc2 "$B/hand2" 2
  $VPY bench/h200/tps.py --warmup 5 --world 2 specops_nproc2="$WD/runs/h200-nproc2/output.log" \
    by_hand_nproc2="$B/hand2/output.log" | tee "$B/tps-nproc2.json"
  say "2 GPUs: $(grep -A3 '"ratio"' "$B/tps-nproc2.json" | tr -d '\n ')"
  if [ -f "$B/tps.json" ]; then $VPY - "$B/tps.json" "$B/tps-nproc2.json" <<'EOF' | tee -a "$B/summary.txt"
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:3])
a, b = one["specops"]["median_tokens_per_s"], two["specops_nproc2"]["median_tokens_per_s"]
print(f"scaling: 2 GPUs {b} tokens/s vs 1 GPU {a}: x{b / a:.3f} (efficiency {b / (2 * a):.3f})")
EOF
  fi
  true
}

s_twonode() {
  [ "${NG:-1}" -ge 2 ] || { echo "needs 2 GPUs (have ${NG:-0})"; return 1; }
  local rid=h200-2node log=$WD-n0/runs/h200-2node/output.log before
  before=$(gpu_mem)
  rm -rf "$WD-n0/runs/$rid" "$WD-n1/runs/$rid"
  echo "gpu memory before: $before MiB"
  $INV train --host @pair --config "$CONFIG" --run-id $rid --max-steps 100000 --epochs 20 --dataset "$WD/data/default" \
    --verifier "$VER" || return 1
  for i in $(seq 1 200); do grep -q "global_step=28\b" "$log" 2>/dev/null && break; sleep 2; done
  local during; during=$(gpu_mem)
  echo "gpu memory during: $during MiB"
  $INV status --host @pair
  $INV logs --host @pair --rank 1 --run-id $rid | tail -5
  for n in n0 n1; do echo "$n: $($VPY -c "import json; print(' '.join(json.load(open('$WD-$n/runs/$rid/run.json'))['command'][:17]))")"; done
  local pg0 pg1
  pg0=$($VPY -c "import json; print(json.load(open('$WD-n0/runs/$rid/job.json'))['pgid'])")
  pg1=$($VPY -c "import json; print(json.load(open('$WD-n1/runs/$rid/job.json'))['pgid'])")
  local tag0 tag1
  tag0=$($VPY -c "import json; print(json.load(open('$WD-n0/runs/$rid/job.json'))['tag'])")
  tag1=$($VPY -c "import json; print(json.load(open('$WD-n1/runs/$rid/job.json'))['tag'])")
  echo "processes of the job: n0 group $pg0: $(alive_in_group "$pg0"), tagged $tag0: $(alive_tagged "$tag0"); n1 group $pg1: $(alive_in_group "$pg1"), tagged $tag1: $(alive_tagged "$tag1")"
  local t0; t0=$(date +%s%N)
  $INV stop --host @pair --run-id $rid --grace 60
  local t1; t1=$(date +%s%N)
  local after left; after=$(gpu_mem); left="$(alive_in_group "$pg0")+$(alive_in_group "$pg1") in the groups, $(alive_tagged "$tag0")+$(alive_tagged "$tag1") tagged"
  sleep 3; local after3; after3=$(gpu_mem)
  $INV status --host @pair
  ls "$WD-n0/runs/$rid/checkpoints/" "$WD-n0/runs/$rid/checkpoints/interrupted" 2>&1 | head -20
  cat "$WD-n0/runs/$rid/exit_code" "$WD-n1/runs/$rid/exit_code"
  grep -h -i "interrupt\|sigterm" "$log" "$WD-n1/runs/$rid/output.log" | cut -c1-200 | head
  $VPY bench/h200/tps.py --warmup 5 --world 2 two_nodes="$log" specops_nproc2="$WD/runs/h200-nproc2/output.log" \
    | tee "$B/tps-2node.json"
  say "2 nodes: $(grep -A3 '"ratio"' "$B/tps-2node.json" | tr -d '\n ')"
  say "2-node stop: gpu MiB before=$before during=$during right-after-stop=$after +3s=$after3; stop took $(( (t1 - t0) / 1000000 )) ms; live processes left: $left"
}

s_resume2() {  # two nodes: one epoch, then the same run id for two: rank 0's checkpoint reaches n1 first
  [ "${NG:-1}" -ge 2 ] || { echo "needs 2 GPUs (have ${NG:-0})"; return 1; }
  local rid=h200-resume
  rm -rf "$WD-n0/runs/$rid" "$WD-n1/runs/$rid"
  $INV train --host @pair --config "$CONFIG" --run-id $rid --epochs 1 --dataset "$WD/data/default" \
    --verifier "$VER" --follow > "$B/resume-first.out" 2>&1
  echo "first rc=$?"; tail -3 "$B/resume-first.out"
  ls "$WD-n0/runs/$rid/checkpoints" "$WD-n1/runs/$rid/checkpoints" 2>&1
  $INV train --host @pair --config "$CONFIG" --run-id $rid --epochs 2 --dataset "$WD/data/default" \
    --verifier "$VER" --follow > "$B/resume-second.out" 2>&1
  local rc=$?
  echo "second rc=$rc"; grep -a "resuming\|Resuming\|Found checkpoint\|every node" "$B/resume-second.out" | cut -c1-200
  for n in n0 n1; do echo "$n: exit $(cat "$WD-$n/runs/$rid/exit_code"), checkpoints: $(ls "$WD-$n/runs/$rid/checkpoints" | tr '\n' ' ')"; done
  say "resume2: second run rc=$rc; $(grep -a -o "resuming from rank 0's epoch [0-9]* checkpoint[^(]*" "$B/resume-second.out" | head -1); $(grep -a -c "Resuming training on epoch 1" "$WD-n0/runs/$rid/output.log" "$WD-n1/runs/$rid/output.log" | tr '\n' ' ')"
  return $rc
}

s_stop() {
  sleep 5
  rm -rf "$WD/runs/h200-stop"
  local before=$(gpu_mem)
  echo "gpu memory before the run: $before MiB"
  $INV train --config "$CONFIG" --run-id h200-stop --max-steps 100000 || return 1
  local log=$WD/runs/h200-stop/output.log
  for i in $(seq 1 150); do grep -q "global_step=5\b" "$log" 2>/dev/null && break; sleep 2; done
  local during=$(gpu_mem)
  local pgid=$($VPY -c "import json; print(json.load(open('$WD/runs/h200-stop/job.json'))['pgid'])")
  echo "gpu memory during: $during MiB; process group $pgid:"; ps -o pid,pgid,etimes,cmd --pid "$(pgrep -d, -g "$pgid")" | cut -c1-150
  local t0=$(date +%s%N)
  $INV stop --run-id h200-stop --grace 60
  local t1=$(date +%s%N)
  local tag=$($VPY -c "import json; print(json.load(open('$WD/runs/h200-stop/job.json')).get('tag', ''))")
  local after=$(gpu_mem) left="$(alive_in_group "$pgid") in the group, $(alive_tagged "$tag") tagged"
  echo "processes left in process group $pgid: $(alive_in_group "$pgid") (zombies not counted: $(pgrep -g "$pgid" | wc -l) listed)"
  sleep 3; local after3=$(gpu_mem)
  $INV status
  ls "$WD/runs/h200-stop/checkpoints/" "$WD/runs/h200-stop/checkpoints/interrupted" 2>&1 | head
  say "stop: gpu MiB before=$before during=$during right-after-stop=$after +3s=$after3; stop took $(( (t1 - t0) / 1000000 )) ms; processes left right after: $left"
}

s_deepall() {
  $INV check --deep --all
  echo "rc=$?"
}

say "H200 bench: stages $STAGES; $(nvidia-smi --query-gpu=name --format=csv,noheader); $(date -u +%FT%TZ)"
for s in $STAGES; do
  if ! run_stage "$s" "s_$s"; then
    case $s in setup|bootstrap|verifier|data) say "stopping: stage $s failed"; break;; esac
  fi
done
grep -h -E "^\[|tokens/s|ratio|median_tokens|aggregate" "$B"/*.log 2>/dev/null | grep -E "extract|tokens/s" | tail -5 >> "$B/summary.txt"
touch "$B/DONE"
