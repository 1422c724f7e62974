# The ngram side again without --async-scheduling (vLLM 0.26 refuses async scheduling with ngram:
# "only supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark"), beside a plain peer without it too (plain-sync),
# benched after serve_bench.sh's loop (never at the same time as it): bash bench/h200/ngram_after.sh VER OUT
VER=$1; OUT=$2; VB=/opt/torch/.venv/bin/vllm; mkdir -p "$OUT"
start() {  # start NAME PORT [args]
  local n=$1 p=$2; shift 2
  echo "$VB serve $VER --port $p --max-model-len 2048 --kv-cache-memory-bytes 6442450944 --gpu-memory-utilization 0.15 --seed 0 $*" > "$OUT/serve-$n.cmd"
  setsid nohup "$VB" serve "$VER" --port "$p" --max-model-len 2048 --kv-cache-memory-bytes 6442450944 --gpu-memory-utilization 0.15 --seed 0 "$@" \
    > "$OUT/serve-$n.log" 2>&1 < /dev/null & echo $! > "$OUT/serve-$n.pid"; }
while [ ! -f /tmp/h200-vllm/sb8b/table.md ]; do sleep 3; done  # (started after: no server start beside a timed run)
start ngram 8104 --speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'
start plain-sync 8106
for p in 8104 8106; do t0=$SECONDS; until curl -sf "localhost:$p/health" >/dev/null || [ $((SECONDS - t0)) -gt 300 ]; do sleep 2; done; done
cp /tmp/h200-vllm/sb8b/prompts.jsonl "$OUT/"
declare -A PORT=([ngram]=8104 [plain-sync]=8106)
for r in 1 2 3; do for c in 1 16; do n=24; [ $c != 1 ] && n=128
  for s in plain-sync ngram; do
    curl -sf "localhost:${PORT[$s]}/health" >/dev/null || { echo "$s not up"; continue; }
    "$VB" bench serve --backend vllm --model "$VER" --base-url "http://localhost:${PORT[$s]}" --dataset-name custom \
      --dataset-path "$OUT/prompts.jsonl" --custom-output-len 256 --num-prompts $n --max-concurrency $c --temperature 0 \
      --seed $r --num-warmups 2 --percentile-metrics ttft,tpot,itl,e2el --save-result --result-dir "$OUT" \
      --result-filename "$s-c$c-r$r.json" --disable-tqdm > "$OUT/$s-c$c-r$r.log" 2>&1 || echo "bench $s c$c r$r failed"
  done; done; done
for s in ngram plain-sync; do kill -- -"$(cat "$OUT/serve-$s.pid")" 2>/dev/null; done
/opt/torch/.venv/bin/python3 bench/h200/bench_table.py "$OUT" | tee "$OUT/table.md"
touch "$OUT/DONE"
