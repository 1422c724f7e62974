#!/bin/bash
# Wait (at most $1 s) for bench/h200/all.sh to finish, then pack its logs, the runs' logs and
# records, the deep-check verdict and attempt logs into $OUT/bench.tgz (kept as bench/results/raw/NAME.tgz: bench/README.md); print the summary.
B=/tmp/h200-bench
WD=/tmp/specops-h200
if [ ! -d "$B" ]; then echo "no /tmp/h200-bench here: a fresh machine (the bench is gone)"; exit 3; fi
end=$((SECONDS + ${1:-540}))
while [ ! -f "$B/DONE" ] && [ $SECONDS -lt $end ]; do sleep 5; done
C=/tmp/h200-collect; rm -rf "$C"; mkdir -p "$C/runs" "$C/deep"
cp "$B"/*.log "$B"/*.txt "$B"/*.json "$B"/*.yaml "$B"/*.out "$C/" 2>/dev/null
cp "$B/hand/output.log" "$C/hand-output.log" 2>/dev/null
cp "$B/hand2/output.log" "$C/hand2-output.log" 2>/dev/null
for r in "$WD"/runs/*/ "$WD"-n[01]/runs/*/; do
  n=$(basename "$r"); case $r in *-n0/*) n=n0-$n;; *-n1/*) n=n1-$n;; esac
  mkdir -p "$C/runs/$n"; cp "$r"/*.json "$r"/output.log "$r"/exit_code "$C/runs/$n/" 2>/dev/null
  ls -la "$r/checkpoints" "$r/checkpoints/interrupted" > "$C/runs/$n/checkpoints.txt" 2>&1
done
cp "$WD/.specops/deep-check.json" "$WD/.specops/env-cuda.txt" "$C/deep/" 2>/dev/null
cp -r "$WD/.specops/logs" "$C/install-logs" 2>/dev/null
for a in "$WD"/.specops/deep-check/attempt-*; do cp "$a/output.log" "$C/deep/$(basename "$a").log" 2>/dev/null; done
cp "$WD"/.specops/deep-check/fixture.log "$C/deep/" 2>/dev/null
tar czf "$OUT/bench.tgz" -C /tmp h200-collect
cp "$B/summary.txt" "$OUT/summary.txt" 2>/dev/null
[ -f "$B/DONE" ] && echo "BENCH DONE" || echo "BENCH STILL RUNNING (stage logs so far packed)"
cat "$B/summary.txt"
echo "--- tail of the current stage log:"; ls -t "$B"/*.log | head -1 | xargs tail -c 3000
