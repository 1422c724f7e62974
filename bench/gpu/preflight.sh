#!/bin/bash
# Issue 47's de-risking run: CUDA vLLM 0.26 serves an UNTRAINED draft of each bake-off kind (P-EAGLE: eagle3 with
# parallel_drafting; DFlash; EAGLE-3 as the control) on the tiny random verifier, through specops' own draft-serves
# preflight (`inv check --serve --config bench/gpu/bakeoff/KIND.yaml --verifier V`), the three at once on the one
# GPU (each server --gpu-memory-utilization 0.2, a 1 GiB KV cache). No training: `inv make-verifier` builds the
# verifier in seconds. Run from the repo root on the GPU machine, once the wheelhouse's parts are in /tmp/parts
# (bench/gpu/bakeoff.sh says how they are made and carried):
#
#   bash bench/gpu/preflight.sh [STAGES]     # default: setup boot verifier serve; logs packed into $OUT
#
# Settings (environment): DRAFTS (default peagle,dflash,eagle3), CONFIGS (default bench/gpu/bakeoff: the configs
# the bake-off trains), LAYERS (`inv check --layers`: the aux layer ids and the last, default 1,3,4,6), DEADLINE (seconds from the start by which everything is packed, default 290: each stage
# runs under `timeout`, the serve stage gets what is left), VARGS (the servers' --vllm-arg flags), SETUP_HOSTS=cpu
# (the CPU dry run: INV a laptop venv's inv, VPY's venv as the host's, nothing installed).
set -u
B=${B:-/tmp/preflight-gpu}
VPY=${VPY:-/opt/torch/.venv/bin/python3}
VENV=$(dirname "$(dirname "$VPY")")
P=${P:-/tmp/parts}
W=${W:-/tmp/wheelhouse}
WD=${WD:-/tmp/specops-gpu}
INV=${INV:-/tmp/lap/bin/inv}
REPO=$PWD
OUT=${OUT:-$B/out}
source "$REPO/bench/laptop_side.sh"  # join_wheelhouse PARTS, laptop_side

STAGES=${*:-setup boot verifier serve}
DRAFTS=${DRAFTS:-peagle,dflash,eagle3}
CONFIGS=${CONFIGS:-$REPO/bench/gpu/bakeoff}
DEADLINE=${DEADLINE:-290}
VARGS=${VARGS:---vllm-arg=--gpu-memory-utilization=0.2 --vllm-arg=--kv-cache-memory-bytes=1073741824}
LAYERS=${LAYERS:-1,3,4,6}  # (the tiny verifier's 6 layers: speculators' default ids [2, 3, 3] are refused)
V=$WD/models/tiny-llama
START=${START:-$(date +%s)}; export START  # (the run's start: the stages' subshells count from it too)
el() { echo $(( $(date +%s) - START )); }
mkdir -p "$B" "$OUT"
export SPECOPS_HOSTS=$B/hosts.yaml SPECOPS_HOST=local PYTHONUNBUFFERED=1 COLUMNS=200 CI=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
say() { echo "[$(date +%T) +$(el)s] $*" | tee -a "$B/summary.txt" "$OUT/summary.txt"; }
stage() {  # NAME LIMIT: s_NAME under `timeout LIMIT`, its output in $B/NAME.log
  local name=$1 limit=$2 t0; t0=$(el)
  say "== $name: start (at most ${limit}s)"
  timeout -k 5 "$limit" bash -c "source '$0' --lib; s_$name" > "$B/$name.log" 2>&1
  local rc=$?
  say "== $name: rc=$rc in $(( $(el) - t0 ))s$([ $rc = 124 ] && echo ' (timed out)')"
  return $rc
}

s_setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  if [ "${SETUP_HOSTS:-cuda}" = cpu ]; then  # (the CPU dry run: nothing joined or installed; INV a laptop venv's)
    cpu_hosts; return
  fi
  join_wheelhouse "$P" || return 1
  ls "$W" | grep -E '^(vllm|speculators)-'
  laptop_side
}

s_boot() { $INV bootstrap --wheelhouse "$W"; }

s_verifier() { $INV make-verifier --path "$V" --overwrite && head -c 600 "$V/config.json"; }

s_serve() {  # each kind's preflight at once, each under what is left of the deadline
  local left=$(( DEADLINE - $(el) - 15 )) pids=() k
  [ "$left" -lt 60 ] && { echo "only ${left}s left: no preflight started"; return 1; }
  echo "each preflight: at most ${left}s"
  for k in ${DRAFTS//,/ }; do
    # shellcheck disable=SC2086 # (VARGS: one flag a word)
    ( t0=$SECONDS; timeout -k 5 "$left" $INV check --serve --config "$CONFIGS/$k.yaml" --verifier "$V" --layers "$LAYERS" $VARGS \
        > "$B/check-$k.log" 2>&1; echo "$k rc=$? in $((SECONDS - t0))s" > "$B/rc-$k.txt" ) &
    pids+=($!)
    sleep 2  # (their `vllm` imports and compiles still overlap; the first one's host caches are set up first)
  done
  wait "${pids[@]}"
  for k in ${DRAFTS//,/ }; do
    cat "$B/rc-$k.txt"; grep -E 'draft-serves preflight|could not|✗|error|Error' "$B/check-$k.log" | head -8
  done
}

pack() {  # the host's preflight records and logs (a failed one keeps its draft.log and server log), then $OUT
  local C=$B/collect
  rm -rf "$C"; mkdir -p "$C"
  cp "$B"/*.log "$B"/*.txt "$B"/hosts.yaml "$C/" 2>/dev/null
  cp "$WD"/.specops/serve-check/*.json "$C/" 2>/dev/null
  for d in "$WD"/.specops/serve-check/*/; do
    [ -d "$d" ] || continue
    n=$(basename "$d")
    for f in "$d"draft.log "$d"server/output.log; do
      [ -f "$f" ] && tail -c 300000 "$f" > "$C/$n-$(basename "$(dirname "$f")")-$(basename "$f")"; done
  done
  cp "$WD"/.specops/env-*.txt "$C/" 2>/dev/null
  "$VPY" -m pip list 2>/dev/null | grep -iE '^(vllm|speculators|torch|flashinfer|transformers|triton) ' > "$C/versions.txt"
  tar czf "$OUT/preflight.tgz" -C "$B" collect && ls -la "$OUT"
}

[ "${1:-}" = --lib ] && return 0
say "preflight run: stages $STAGES; drafts $DRAFTS; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null); $(date -u +%FT%TZ)"
for s in $STAGES; do
  case $s in setup) lim=60;; boot) lim=100;; verifier) lim=60;; *) lim=$(( DEADLINE - $(el) - 5 ));; esac
  if ! stage "$s" "$lim"; then
    case $s in setup|boot|verifier) say "stopping: stage $s failed"; tail -30 "$B/$s.log"; break;; esac
  fi
done
cat "$B/serve.log" 2>/dev/null
pack
say "done"
