#!/bin/bash
# Issue 47's GPU "must show": `inv bakeoff` of EAGLE-3, P-EAGLE and DFlash on one learnable verifier, every step a
# specops task on the GPU machine's `local` host (its preinstalled /opt/torch/.venv topped up by `inv bootstrap`), as
# bench/gpu/smollm2.sh and bench/h200/vllm.sh run them:
#
#   bash bench/gpu/bakeoff.sh verifier            # first call: the verifier's training started (setsid), see below
#   bash bench/gpu/bakeoff.sh start [WAIT] [STAGES]  # setsid the run, then `collect WAIT`
#   bash bench/gpu/bakeoff.sh collect [WAIT]      # wait for DONE (at most WAIT s), pack into $OUT/bakeoff.tgz
#   bash bench/gpu/bakeoff.sh all [STAGES]        # the run itself (what `start` launches)
#
# The parts (56 MiB each, one a device call, copied to /tmp/parts) hold wheelhouse/ (`inv wheelhouse --profile cuda
# --have bench/h200/h200-freeze.txt --laptop`: the cuda-torch2.11 profile, vLLM 0.26.0, speculators 0.9.0, and
# laptop/). `verifier` needs only the torch venv: the first call starts it while the parts arrive. Its size: SIZE,
# else 8b where GPU 0 has 120 GiB or more (an H200: Llama-3.1-8B's shape, ~130 s), else 1b (an H100: the 3b's
# training ran out of its 80 GB on 2026-12-07). SIZE=8b on an 80 GB card: the fixture freezes more of its layers so
# that its training fits (learnable_verifier.fit_frozen: its top 6 trained), KV 4 GiB and SIDE 3 (three 16 GB servers).
# Settings (environment): DRAFTS (default eagle3,dflash,peagle: the reference first, P-EAGLE last, the slowest on
# the H100's 1B, bench/results/bakeoff-gpu.md: a run cut short by the device time keeps the first ones), KS (the
# k each kind is served at, default eagle3:5,peagle:7,dflash:7), TUNE (the k
# each is also timed at, default eagle3:3,peagle:5,dflash:5), REQS (requests per level and side, default
# 16 at one request, 25 s for the 8b on an H100, and 4 waves at each other level: 1:16,16:64; one wave at 16
# was `short`, 2-3 s, in the fifth run), CEILING (synthetic acceptance rates each kind's draft is also timed at, at its k; default 1:
# every proposal accepted, the most a draft of that cost can buy), KV (each server's KV cache bytes: 8 GiB on the
# 8b on a card of 120 GiB or more, else 4 GiB), EXTRACT (hf, the default: transformers, no server to start; or vllm), EPOCHS (override the configs' epochs), LEVELS (1,16), REPEATS (3), SIDE (servers up at once, 4; 3 for the 8b under 120 GiB),
# BAKE_ARGS (more `inv bakeoff` flags: the CPU check's --max-steps 2 --max-prompts 8 --vllm-arg=--enforce-eager),
# VERIFIER_ARGS (more learnable_verifier flags for the `verifier` call, e.g. --steps 600: the 8b with 26 frozen layers
# agreed 0.854-0.859 after its preset's 300 steps on an H100, its loss still falling; the H200's 16-frozen 0.92-0.93).
# Stages (each one's output in $B/<stage>.log, a line per stage in $B/summary.txt):
#   setup      join the parts; laptop-side venv /tmp/lap from laptop/ wheels; hosts.yaml (SETUP_HOSTS=cpu: the CPU
#              dry run's: the laptop's own venv as /tmp/lap, VPY's venv as the host's, nothing installed)
#   boot       inv bootstrap --wheelhouse W
#   verifier   wait for the verifier `verifier` trains (else train it here: inv make-verifier --learnable)
#   prep       the demo's 267 conversations: inv prepare-data --seq-length 512 (vLLM's GPU-less render server)
#   extract    inv extract (the verifier's default layers, eager): the three kinds read the same hidden states
#   bake       inv bakeoff --drafts DRAFTS --configs bench/gpu/bakeoff (each kind's config: the same rows
#              and batches) --hidden-states offline --no-serve-check --speedup 1,16 --repeats 3 --baselines
#              none --num-spec-tokens KS --tune-k TUNE --side-by-side 4 --speedup-requests REQS --ceiling CEILING:
#              each kind's four servers (its draft at its k, at the tune k, at each ceiling rate, the verifier alone)
#              up at once, every ratio paired with the verifier alone timed beside it
#   (RUN: the bake-off's id, default bo)
#   demo       (named only) `inv demo --size SIZE --speedup DEMO_LEVELS --repeats REPEATS`: the demo on this card, e.g.
#              SIZE=8b on an H100 (`... start 560 setup boot verifier demo`): is its one-request figure within 5%?
#   show       the bake-off's JSON in short (each kind's settings, ratios, acceptance by position, ceiling)
set -u
MODE=${1:-all}
B=${B:-/tmp/bakeoff-gpu}
VPY=${VPY:-/opt/torch/.venv/bin/python3}
VENV=$(dirname "$(dirname "$VPY")")
P=${P:-/tmp/parts}
W=${W:-/tmp/wheelhouse}
WD=${WD:-/tmp/specops-gpu}
INV=${INV:-/tmp/lap/bin/inv}  # (INV=echo: a function's commands said, nothing run: `bash -n` and a dry check)
REPO=$PWD
SIZE_FILE=${SIZE_FILE:-/tmp/bakeoff-size.txt}
source "$REPO/bench/laptop_side.sh"  # join_wheelhouse PARTS, laptop_side

big_gpu() {  # GPU 0 has 120 GiB or more (an H200): the 8b trains with its preset, four 8b servers fit
  local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
  [ "${mib:-0}" -ge 122880 ]
}

gpu_size() {  # SIZE, else 8b where GPU 0 has 120 GiB or more, else 1b
  [ -n "${SIZE:-}" ] && { echo "$SIZE"; return; }
  big_gpu && echo 8b || echo 1b
}

if [ "$MODE" = verifier ]; then  # (the first call: the torch venv alone; its log /tmp/verifier.log)
  size=$(gpu_size); echo "$size" > "$SIZE_FILE"
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  mkdir -p "$WD/models"; cd "$WD" || exit 1
  setsid nohup env PYTHONPATH="$REPO/remote" "$VPY" -m specops_host.fixtures.learnable_verifier \
    "$WD/models/learnable-llama-$size" --size "$size" --overwrite ${VERIFIER_ARGS:-} > /tmp/verifier.log 2>&1 < /dev/null &
  sleep 25; echo "verifier $size started: $WD/models/learnable-llama-$size"; cat /tmp/verifier.log; exit 0
fi
drafts_problem() {  # (cheap checks first) STAGES ($1, empty: the default, bake among them) with a bake of one kind:
  # `inv bakeoff` refuses it (bakeoff.parse_drafts), so say so before setup, not after its minutes (2026-12-07)
  local d=${DRAFTS:-eagle3,dflash,peagle} ks; [ -z "$1" ] || [[ " $1 " == *" bake "* ]] || return 1
  IFS=, read -ra ks <<< "$d"; [ "${#ks[@]}" -ge 2 ] && return 1
  echo "DRAFTS=$d: a bake-off compares two or more kinds (such as eagle3,peagle): name another, or leave out the bake stage"
}
if [ "$MODE" = start ] || [ "$MODE" = all ]; then
  if why=$(drafts_problem "${*:$([ "$MODE" = start ] && echo 3 || echo 2)}"); then echo "$why" >&2; exit 2; fi
fi
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
  C=/tmp/bakeoff-collect; rm -rf "$C"; mkdir -p "$C"
  cp "$B"/*.log "$B"/*.txt "$B"/*.yaml "$B"/*.out "$B"/*.json "$C/" 2>/dev/null
  cp /tmp/verifier.log "$C/" 2>/dev/null
  for r in "$WD"/runs/*/; do
    n=$(basename "$r"); mkdir -p "$C/runs/$n"
    cp "$r"/*.json "$r"/output.log "$r"/exit_code "$C/runs/$n/" 2>/dev/null
    cp "$r"/evaluation/*.json "$C/runs/$n/" 2>/dev/null
    [ -d "$r"/evaluation/bench ] && cp -r "$r"/evaluation/bench "$C/runs/$n/bench"  # (each vllm bench serve JSON)
    for s in "$r"/evaluation/output.log "$r"/evaluation/*/output.log "$r"/evaluation/*/server/output.log; do
      [ -f "$s" ] && tail -c 200000 "$s" > "$C/runs/$n/eval-$(echo "${s#"$r"evaluation/}" | tr / -)"; done
    ls -la "$r/checkpoints" > "$C/runs/$n/checkpoints.txt" 2>&1
    for k in "$r"/checkpoints/*/config.json; do [ -f "$k" ] && cp "$k" "$C/runs/$n/ckpt-$(basename "$(dirname "$k")")-config.json"; done
  done
  (cd "$B" && find lap-runs -type f \( -name '*.json' -o -name '*.log' -o -name '*.png' \) -size -2M -print0 \
     2>/dev/null | xargs -0 -r cp --parents -t "$C") 2>/dev/null
  cp "$WD"/.specops/env-cuda.txt "$C/" 2>/dev/null
  find "$C" -type f -size +3M -delete
  tar czf "$OUT/bakeoff.tgz" -C /tmp bakeoff-collect; ls -la "$OUT/bakeoff.tgz"
  cp "$B/summary.txt" "$OUT/" 2>/dev/null; cp "$B"/lap-runs/*.png "$OUT/" 2>/dev/null
  [ -f "$B/DONE" ] && echo "RUN DONE" || echo "RUN STILL GOING (packed so far)"
  cat "$B/summary.txt"
  [ -f "$B/show.txt" ] && cat "$B/show.txt"
  echo "--- tail of the newest log:"; ls -t "$B"/*.log | head -1 | xargs tail -c 3000
  exit 0
fi

STAGES=${*:2}
STAGES=${STAGES:-setup boot verifier prep extract bake show}
SIZE=$(cat "$SIZE_FILE" 2>/dev/null || gpu_size)
V=$WD/models/learnable-llama-$SIZE
DRAFTS=${DRAFTS:-eagle3,dflash,peagle}
of_drafts() {  # KIND:K,... less the kinds DRAFTS leaves out (inv bakeoff refuses a k for a kind it does not run)
  local kv out=(); IFS=, read -ra kvs <<< "$1"
  for kv in "${kvs[@]}"; do [[ ",$DRAFTS," == *",${kv%%:*},"* ]] && out+=("$kv"); done
  (IFS=,; echo "${out[*]}")
}
KS=$(of_drafts "${KS:-eagle3:5,peagle:7,dflash:7}")
TUNE=$(of_drafts "${TUNE-eagle3:3,peagle:5,dflash:5}")  # (TUNE= : no sweep)
CEILING=${CEILING-1}
BIG=$(big_gpu && echo 1 || echo 0)  # (an H200: four 8b servers fit; an 80 GB card: three)
KV=${KV:-$([ "$SIZE" = 8b ] && [ "$BIG" = 1 ] && echo 8589934592 || echo 4294967296)}
LEVELS=${LEVELS:-1,16}; REQS=${REQS:-$(sep=; IFS=,; for l in $LEVELS; do  # (16 at 1, 4 waves elsewhere)
  printf '%s%s:%s' "$sep" "$l" "$([ "$l" = 1 ] && echo 16 || echo $((4 * l)))"; sep=,; done)}
REPEATS=${REPEATS:-3}; SIDE=${SIDE:-$([ "$SIZE" = 8b ] && [ "$BIG" = 0 ] && echo 3 || echo 4)}
mkdir -p "$B"; rm -f "$B/DONE"
gpu_run_env

s_setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  df -h /tmp | tail -1
  if [ "${SETUP_HOSTS:-cuda}" = cpu ]; then  # (the CPU dry run: nothing joined or installed)
    ln -sfn "$REPO/.venv" /tmp/lap
    cpu_hosts; return
  fi
  join_wheelhouse "$P" || return 1
  ls "$W" | wc -l; du -sh "$W"; ls "$W" | grep -E '^(vllm|speculators)-'
  laptop_side
}

s_boot() {
  $INV bootstrap --wheelhouse "$W"
}

s_verifier() {  # the verifier `verifier` trains (15 minutes at most), else trained here
  local t0=$SECONDS
  while pgrep -f "learnable_verifier $V" > /dev/null && [ $((SECONDS - t0)) -lt 900 ]; do sleep 3; done
  tail -4 /tmp/verifier.log 2>/dev/null
  if [ ! -f "$V/specops-verifier.json" ]; then  # (the first call's training missing or failed: out of memory, say)
    local size=$SIZE; [ -f /tmp/verifier.log ] && [ "$SIZE" = 3b ] && size=1b  # (a card where the 3b failed: 1b)
    say "verifier: none at $V ($(tail -1 /tmp/verifier.log 2>/dev/null | cut -c1-200)): inv make-verifier --learnable --size $size, into $V"
    $INV make-verifier --learnable --size "$size" --path "$V" --overwrite || return 1
  fi
  say "verifier $SIZE ready after $((SECONDS - t0)) s of waiting: $(head -c 400 "$V/specops-verifier.json" | tr -s ' \n' ' ')"
}

s_prep() {
  PYTHONPATH=$REPO /tmp/lap/bin/python3 -c "import sys; from pathlib import Path; from specops.ops.pipeline import demo_conversations as d; d(Path(sys.argv[1]))" "$B/convs.jsonl" || return 1
  wc -l "$B/convs.jsonl"
  rm -rf "$WD/data/bo"
  $INV prepare-data --data "$B/convs.jsonl" --dataset bo --verifier "$V" --seq-length 512 --vllm-arg=--enforce-eager
}

s_extract() {  # (LAYERS: the layer ids, default speculators'; the CPU check's tiny verifier has 4 layers: 1,2,3,4)
  local ly=(); [ -n "${LAYERS:-}" ] && ly=(--layers "$LAYERS")
  if [ "${EXTRACT:-hf}" = hf ]; then  # (EXTRACT=hf, the default: no vLLM server to start, the rows through transformers)
    $INV extract --dataset bo --verifier "$V" "${ly[@]}" --backend hf; return
  fi
  $INV extract --dataset bo --verifier "$V" "${ly[@]}" --vllm-arg=--enforce-eager
}

s_bake() {
  local ep=(); [ -n "${EPOCHS:-}" ] && ep=(--epochs "$EPOCHS")
  local tk=(); [ -n "$TUNE" ] && tk=(--tune-k "$TUNE")
  local cl=(); [ -n "$CEILING" ] && cl=(--ceiling "$CEILING")
  $INV bakeoff --drafts "$DRAFTS" --configs "$REPO/bench/gpu/bakeoff" --dataset bo --verifier "$V" --run-id "${RUN:-bo}" \
    --hidden-states offline --no-serve-check --speedup "$LEVELS" --repeats "$REPEATS" --baselines none \
    --num-spec-tokens "$KS" "${tk[@]}" --side-by-side "$SIDE" --speedup-requests "$REQS" "${cl[@]}" \
    "${ep[@]}" --vllm-arg=--kv-cache-memory-bytes="$KV" --vllm-arg=--gpu-memory-utilization=0.15 ${BAKE_ARGS:-} \
    --dest "$B/lap-runs"
}

s_demo() {  # (not a default stage) issue 47 item 4: `inv demo` on this card with the SIZE verifier (the one `verifier`
  # trained: the demo's own path, reused), its speedup timed REPEATS times at DEMO_LEVELS (default 1)
  $INV demo --size "$SIZE" --speedup "${DEMO_LEVELS:-1}" --repeats "$REPEATS" --dest "$B/lap-runs"
}

s_show() {  # the bake-off's JSON in short, else each kind's evaluation (a bake-off cut short writes no JSON)
  PYTHONPATH=$REPO /tmp/lap/bin/python3 - "$B/lap-runs" "${RUN:-bo}" <<'PY' | tee "$B/show.txt"
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/{sys.argv[2]}.json")):
    b = json.load(open(f))
    for r in b["rows"]:
        print(r["kind"], "k", r.get("num_spec_tokens"), "acc", r.get("mean_acceptance_length"), "by position",
              r.get("acceptance_by_position"), "error", r.get("error"))
        print("  best", json.dumps(r["by_concurrency"]), "\n  settings", json.dumps(r.get("settings")),
              "\n  ceiling", json.dumps(r.get("ceiling")))
    print("winners", json.dumps(b["winners"]), "pending", b.get("pending"))
for f in sorted(glob.glob(f"{sys.argv[1]}/{sys.argv[2]}-*/evaluation.json")):
    e = json.load(open(f))
    sp = e.get("speedup") or {}
    print(f, e.get("draft"), e.get("num_spec_tokens"), e.get("mean_acceptance_length"), e.get("seconds"))
    for n, s in (sp.get("sides") or {}).items():
        print("  ", n, {c: ((v.get("ratio") or {}).get("median"), v["output_tokens_per_s"]["median"],
                            v.get("acceptance_length")) for c, v in s["by_concurrency"].items()})
PY
}

say "bake-off GPU run: stages $STAGES; verifier $SIZE; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null); $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=timestamp,clocks.sm,temperature.gpu,power.draw,utilization.gpu,memory.used \
  --format=csv -l 5 > "$B/gpu-samples.txt" 2>&1 &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
for s in $STAGES; do
  if ! stage "$s" "s_$s"; then
    case $s in setup|boot|verifier|prep|extract) say "stopping: stage $s failed"; break;; esac
  fi
done
df -h /tmp | tail -1 >> "$B/summary.txt"
touch "$B/DONE"
