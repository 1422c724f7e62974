#!/bin/bash
# The H200 bench, every step through specops with the `local` transport (run from the repo root
# on the GPU machine; started in the background by start.sh, collected by collect.sh):
#   setup      laptop-side venv /tmp/lap from the carried wheels (.whl/cuda-h200/laptop), hosts.yaml
#   bootstrap  inv bootstrap --wheelhouse .whl/cuda-h200   (top-up of the preinstalled /opt/torch/.venv)
#   check      inv check ; inv check --deep ; the train gate on the default config
#   verifier   random Llama-3.1-8B-sized verifier on the GPU (bench/h200/make_verifier_8b.py)
#   data       inv prepare-data (256 pre-tokenised rows x 1024) ; inv extract --backend hf ; inv inspect-data
#   train      inv train (torchrun, 25 steps) ; the same flags by hand with `speculators train` ; tps.py
#   stop       inv train (long) ; inv stop mid-run ; process group and GPU memory before/after
#   deepall    inv check --deep --all (every fallback)
set -u
STAGES=${*:-setup bootstrap check verifier data train stop deepall}
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
INV=/tmp/lap/bin/inv
STEPS=${STEPS:-25}
mkdir -p "$B"
export SPECOPS_HOSTS=$B/hosts.yaml SPECOPS_HOST=local PYTHONUNBUFFERED=1 COLUMNS=160 CI=1
say() { echo "[$(date +%T)] $*" | tee -a "$B/summary.txt"; }
alive_in_group() { local n=0 p; for p in $(pgrep -g "$1"); do [[ "$(ps -o stat= -p "$p")" == Z* ]] || n=$((n + 1)); done; echo $n; }
gpu_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1 || echo n/a; }
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
  rm -rf /tmp/lap
  $VPY -m venv --without-pip /tmp/lap
  $VPY -m pip --python /tmp/lap/bin/python3 install -q --no-index --no-deps "$WHL"/laptop/*.whl || return 1
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
  [ "$PROFILE" = cuda ] && echo "    gpus: 1" >> "$B/hosts.yaml"
  $INV hosts
}

s_bootstrap() {
  $VPY -m pip list --format=freeze > "$B/freeze-before.txt"
  $INV bootstrap --wheelhouse "$WHL" --dry-run
  $INV bootstrap --wheelhouse "$WHL" || return 1
  $INV bootstrap --wheelhouse "$WHL"          # again: verifies only
  $VPY -m pip list --format=freeze > "$B/freeze-after.txt"
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
  # the train gate (specops.check.refuse_failed_settings) on the default config and on the bench config
  /tmp/lap/bin/python3 - <<'EOF'
from specops import check, inventory, train
from specops.errors import SpecopsError
from specops.transport import connect
h = inventory.load(None).get("local")
with connect(h) as t:
    for cfg in (None, "bench/h200/eagle3-h200.yaml"):
        flags = train.load_config(cfg, h.profile, {})["flags"]
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

s_train() {
  echo "gpu memory before: $(gpu_mem) MiB"
  rm -rf "$WD/runs/h200-specops"
  $INV train --config "$CONFIG" --run-id h200-specops --max-steps "$STEPS" --follow || return 1
  # the same training by hand: the flags inv train ran (run.json), plain `speculators train`, plain shell env
  CMD=$($VPY - "$WD/runs/h200-specops/run.json" "$B/hand" "$VENV" <<'EOF'
import json, shlex, sys
argv = json.load(open(sys.argv[1]))["command"]
if "train" in argv:  # cuda: torchrun ... -m speculators train FLAGS -> speculators train FLAGS
    head, flags = [sys.argv[3] + "/bin/speculators", "train"], argv[argv.index("train") + 1:]
else:  # cpu: python remote/train_cpu.py FLAGS (speculators has no CPU placement of its own)
    i = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    head, flags = argv[:i + 1], argv[i + 1:]
out = sys.argv[2]
for k, v in (("--save-path", out + "/checkpoints"), ("--log-dir", out + "/logs"), ("--run-name", "by-hand")):
    flags[flags.index(k) + 1] = v
print(" ".join(shlex.quote(x) for x in [*head, *flags]))
EOF
)
  echo "by hand: $CMD" | tee -a "$B/summary.txt"
  rm -rf "$B/hand"; mkdir -p "$B/hand"
  (cd "$WD" && env -u SPECOPS_HOSTS -u SPECOPS_HOST COLUMNS=1000 bash -c "$CMD") > "$B/hand/output.log" 2>&1
  echo "by hand rc=$?"
  $VPY bench/h200/tps.py --warmup 5 specops="$WD/runs/h200-specops/output.log" by_hand="$B/hand/output.log" \
    | tee "$B/tps.json"
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
  local after=$(gpu_mem) left=$(alive_in_group "$pgid")
  echo "processes left in process group $pgid: $(alive_in_group "$pgid") (zombies not counted: $(pgrep -g "$pgid" | wc -l) listed)"
  sleep 3; local after3=$(gpu_mem)
  $INV status
  ls "$WD/runs/h200-stop/checkpoints/" "$WD/runs/h200-stop/checkpoints/interrupted" 2>&1 | head
  say "stop: gpu MiB before=$before during=$during right-after-stop=$after +3s=$after3; stop took $(( (t1 - t0) / 1000000 )) ms; processes left in group $pgid right after: $left"
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
