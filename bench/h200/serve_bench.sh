# Issue 31, items 4 and 5: the served speedup measured by vLLM's own benchmark, by hand (no specops
# in the timed path): the verifier plain, with vLLM's training-free ngram speculation, and with the
# trained EAGLE-3 draft at several num_speculative_tokens, each its own `vllm serve` on one GPU,
# all up at once (each its own KV cache size, so their memory profiling cannot race), then
# `vllm bench serve` against each in turn, interleaved, REPEATS times at each concurrency.
# Sourced by bench/h200/vllm.sh (stage 8b): serve_bench VERIFIER DRAFT OUTDIR
#   env: LEVELS ("1 16"), REPEATS (3), KS ("3 5"), NPROMPTS_1 (24), NPROMPTS_N (256), NGRAM (0), STAGGER (2), MAXTOK (256), ASYNC (1)
serve_bench() {
  local ver=$1 draft=$2 out=$3 port=8100 name
  mkdir -p "$out"
  local vllm_bin; vllm_bin=$(dirname "$VPY")/vllm
  # held-out prompts of the language (seed 999: the demo trains on seed 123's conversations)
  PYTHONPATH=$PWD $VPY - "$out/prompts.jsonl" <<'PY'
import json, sys
from specops_host.fixtures import synthlang
with open(sys.argv[1], "w") as f:
    for c in synthlang.conversations(400, seed=999):
        f.write(json.dumps({"prompt": next(m["content"] for m in c if m["role"] == "user")}) + "\n")
PY
  declare -gA SIDE_ARGS=()
  SIDE_ARGS[plain]=""
  # (ngram: vLLM 0.26 refuses --async-scheduling with it; NGRAM=1 adds it: its own server, without async)
  SIDE_ARGS[ngram]='{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'
  for k in ${KS:-3 5}; do SIDE_ARGS[eagle3-k$k]="{\"method\":\"eagle3\",\"model\":\"$draft\",\"num_speculative_tokens\":$k}"; done
  declare -gA SIDE_PORT=()
  local sides="plain"; [ "${NGRAM:-0}" = 1 ] && sides="plain ngram"; for k in ${KS:-3 5}; do sides="$sides eagle3-k$k"; done
  for name in $sides; do
    SIDE_PORT[$name]=$port
    local spec=()
    [ -n "${SIDE_ARGS[$name]}" ] && spec=(--speculative-config "${SIDE_ARGS[$name]}")
    local asy=(); [ "${ASYNC:-1}" = 1 ] && [ "$name" != ngram ] && asy=(--async-scheduling)
    echo "$vllm_bin serve $ver --port $port --max-model-len 2048 --kv-cache-memory-bytes ${KVBYTES:-6442450944} --gpu-memory-utilization ${UTIL:-0.15} --seed 0 ${asy[*]} ${spec[*]}" > "$out/serve-$name.cmd"
    setsid nohup "$vllm_bin" serve "$ver" --port "$port" --max-model-len 2048 --kv-cache-memory-bytes "${KVBYTES:-6442450944}" \
      --gpu-memory-utilization ${UTIL:-0.15} --seed 0 "${asy[@]}" "${spec[@]}" > "$out/serve-$name.log" 2>&1 < /dev/null &
    echo $! > "$out/serve-$name.pid"
    port=$((port + 1))
    sleep "${STAGGER:-2}"  # (--kv-cache-memory-bytes: no memory profiling, so no race between them)
  done
  local up="" t0=$SECONDS
  for name in $sides; do
    until curl -sf "localhost:${SIDE_PORT[$name]}/health" > /dev/null; do
      kill -0 "$(cat "$out/serve-$name.pid")" 2>/dev/null || { echo "server $name died: $(tail -3 "$out/serve-$name.log")"; break; }
      [ $((SECONDS - t0)) -gt 600 ] && { echo "server $name not up in 600 s"; break; }
      sleep 3
    done
    curl -sf "localhost:${SIDE_PORT[$name]}/health" > /dev/null && up="$up $name"
  done
  echo "servers up after $((SECONDS - t0)) s:$up; gpu memory $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  for rep in $(seq 1 "${REPEATS:-3}"); do
    for c in ${LEVELS:-1 16}; do
      local n=${NPROMPTS_1:-24}; [ "$c" != 1 ] && n=${NPROMPTS_N:-256}
      for name in $up; do
        local cmd=("$vllm_bin" bench serve --backend vllm --model "$ver" --base-url "http://localhost:${SIDE_PORT[$name]}"
          --dataset-name custom --dataset-path "$out/prompts.jsonl" --custom-output-len "${MAXTOK:-256}"
          --num-prompts "$n" --max-concurrency "$c" --temperature 0 --seed "$rep" --num-warmups 2
          --percentile-metrics ttft,tpot,itl,e2el --save-result --result-dir "$out"
          --result-filename "$name-c$c-r$rep.json" --disable-tqdm)
        echo "${cmd[*]}" > "$out/$name-c$c-r$rep.cmd"
        "${cmd[@]}" > "$out/$name-c$c-r$rep.log" 2>&1 || echo "bench $name c$c r$rep failed: $(tail -2 "$out/$name-c$c-r$rep.log")"
        grep -h "Output token throughput\|Mean TPOT\|Acceptance length" "$out/$name-c$c-r$rep.log" | tr -s ' ' | paste -sd';' | sed "s/^/$name c$c r$rep: /"
      done
    done
  done
  for name in $sides; do kill -- -"$(cat "$out/serve-$name.pid")" 2>/dev/null; done
  $VPY bench/h200/bench_table.py "$out" | tee "$out/table.md"
}
