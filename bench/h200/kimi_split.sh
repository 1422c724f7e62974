#!/bin/bash
# Issue 12 item 6: `datagen.py --extract --backend hf` of a random Kimi-K2.5-shaped verifier
# (a few billion parameters) on one GPU and split over two GPUs (SPECOPS_GPU_MEMORY_CAP_GIB forces
# the split), the two sets of hidden-state files compared. Run from the repo root on a 2-GPU machine:
#
#   bash bench/h200/kimi_split.sh start [WAIT]    # setsid the whole run (`all`), then `collect WAIT`
#   bash bench/h200/kimi_split.sh collect [WAIT]  # wait for DONE (at most WAIT s), pack into $OUT
#                                                (kept as bench/results/raw/NAME.tgz: bench/README.md)
#   bash bench/h200/kimi_split.sh all             # the run itself (what `start` launches)
#
# Stages of `all` (each one's output in $B/<stage>.log, a line per stage in $B/summary.txt):
#   env      GPUs, link topology, versions
#   build    remote/specops_host/fixtures/tiny_verifier.py --shape kimi (hidden 4096, 12 layers, 16 experts: ~5.2 B params)
#   data     a prepared dataset of $ROWS pre-tokenised rows (specops/synth.write_dataset: pyarrow)
#   one      CUDA_VISIBLE_DEVICES=0, --tensor-parallel 1
#   two      CUDA_VISIBLE_DEVICES=0,1, --tensor-parallel 2, SPECOPS_GPU_MEMORY_CAP_GIB=$CAP
#   nocap    CUDA_VISIBLE_DEVICES=0,1, --tensor-parallel 2, no cap (2 rows): stays on one GPU
#   refuse   CUDA_VISIBLE_DEVICES=0,1, --tensor-parallel 1, the cap (1 row): refused, one line
#   again    `one` once more (CUDA_VISIBLE_DEVICES=0, --tensor-parallel 1): is one GPU deterministic?
#   compare  every hs_i of `one` against `two` (and `again`): token_ids equal, relative max difference
# (one GPU: STAGES="env build data one nocap refuse again compare"; `two` then has nothing to split over)
# datagen.py runs unchanged through a small wrapper ($B/wrap.py) that also logs the placement, the
# device each decoder layer landed on (model.hf_device_map) and torch's peak memory per GPU;
# nvidia-smi samples memory.used every 200 ms during each run ($B/smi-<stage>.csv).
set -u
MODE=${1:-all}
REPO=$(pwd)
B=${B:-/tmp/kimi-split}
PY=${PY:-/opt/torch/.venv/bin/python3}
V=$B/models/kimi-random
ROWS=${ROWS:-128}
CAP=${CAP:-8}
SHAPE=${SHAPE:---layers 12 --hidden 4096 --heads 32 --experts 16 --experts-per-token 2 --moe-intermediate 2048 --intermediate 11008 --vocab 1024}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1

if [ "$MODE" = start ]; then
  rm -rf "$B"; mkdir -p "$B"
  setsid nohup bash "$0" all > "$B/all.out" 2>&1 < /dev/null &
  sleep 2
  exec bash "$0" collect "${2:-540}"
fi
if [ "$MODE" = collect ]; then
  [ -d "$B" ] || { echo "no $B here: a fresh machine (the run is gone)"; exit 3; }
  end=$((SECONDS + ${2:-540}))
  while [ ! -f "$B/DONE" ] && [ $SECONDS -lt $end ]; do sleep 3; done
  (cd "$B" && tar czf "$OUT/kimi-split.tgz" --exclude=models --exclude=data --exclude=wd .)
  cp "$B/summary.txt" "$OUT/" 2>/dev/null
  [ -f "$B/DONE" ] && echo "RUN DONE" || echo "RUN STILL GOING (packed so far)"
  cat "$B/summary.txt"
  echo "--- tail of the newest log:"; ls -t "$B"/*.log | head -1 | xargs tail -c 2500
  exit 0
fi

mkdir -p "$B/wd"
source "$REPO/bench/laptop_side.sh"  # say, stage (the GPU drivers' shared scaffolding)

cat > "$B/wrap.py" <<'EOF'
"""specops_host/data/datagen.py's main, unchanged, with the placement, the device map actually used
and the peak GPU memory logged (monkeypatched around hf_backend's hf_placement and decoder_stack)."""
import atexit, json, os, sys

repo = os.environ["KS_REPO"]
sys.path.insert(0, os.path.join(repo, "remote"))
from specops_host import contract  # noqa: E402
from specops_host.data import datagen, hf_backend  # noqa: E402

_place, _stack = hf_backend.hf_placement, hf_backend.decoder_stack


def hf_placement(*a, **k):
    p = _place(*a, **k)
    print("[kimi-split] placement: " + json.dumps(p, default=str), flush=True)
    return p


def decoder_stack(model, n):
    r = _stack(model, n)
    on = [str(next(m.parameters()).device) for m in r[1]]
    info = {"layers_per_device": {d: on.count(d) for d in dict.fromkeys(on)}, "layer_devices": on,
            "embed": str(model.get_input_embeddings().weight.device),
            "final_norm": str(next(r[2].parameters()).device),
            "hf_device_map": getattr(model, "hf_device_map", None)}
    print("[kimi-split] device map used: " + json.dumps({k: v for k, v in info.items() if k != "hf_device_map"}),
          flush=True)
    with open(os.environ["KS_MAP"], "w") as f:
        json.dump(info, f, indent=1)
    return r


def peak():
    import torch

    if torch.cuda.is_available():
        print("[kimi-split] torch peak memory: " + json.dumps({
            f"cuda:{i}": {"max_allocated_gib": round(torch.cuda.max_memory_allocated(i) / 2**30, 2),
                          "max_reserved_gib": round(torch.cuda.max_memory_reserved(i) / 2**30, 2)}
            for i in range(torch.cuda.device_count())}), flush=True)


hf_backend.hf_placement, hf_backend.decoder_stack = hf_placement, decoder_stack
atexit.register(peak)
sys.argv[0] = os.path.join(repo, "remote", "specops_host", "data", "datagen.py")
contract.main(datagen.main)
EOF

cat > "$B/compare.py" <<'EOF'
"""Every hs_i.safetensors of A against B: token_ids equal, hidden_states relative max difference
max|a - b| / max|b| (as tests/test_pipeline.py compares HF against vLLM), per stored layer too."""
import glob, json, os, sys

import torch
from safetensors.torch import load_file

a_dir, b_dir = sys.argv[1:3]
fa = sorted(glob.glob(a_dir + "/hidden_states/hs_*.safetensors"))
fb = sorted(glob.glob(b_dir + "/hidden_states/hs_*.safetensors"))
res = {"files_a": len(fa), "files_b": len(fb), "compared": 0, "token_ids_equal": 0, "bit_identical": 0,
       "worst_rel": 0.0, "worst_rel_per_layer": None, "worst_abs": 0.0, "mean_rel": 0.0, "tokens": 0}
rels = []
for f in fa:
    g = os.path.join(b_dir, "hidden_states", os.path.basename(f))
    a, b = load_file(f, device="cuda:0"), load_file(g, device="cuda:0")
    res["compared"] += 1
    res["token_ids_equal"] += int(torch.equal(a["token_ids"], b["token_ids"]))
    x, y = a["hidden_states"], b["hidden_states"]
    assert x.shape == y.shape, (f, x.shape, y.shape)
    res["tokens"] += x.shape[0]
    res["bit_identical"] += int(torch.equal(x, y))
    x, y = x.float(), y.float()
    d = (x - y).abs()
    rel = float(d.max() / y.abs().max())
    rels.append(rel)
    res["worst_rel"] = max(res["worst_rel"], rel)
    res["worst_abs"] = max(res["worst_abs"], float(d.max()))
    per = (d.amax(dim=(0, 2)) / y.abs().amax(dim=(0, 2))).tolist()
    res["worst_rel_per_layer"] = per if res["worst_rel_per_layer"] is None else \
        [max(p, q) for p, q in zip(res["worst_rel_per_layer"], per)]
res["mean_rel"] = sum(rels) / max(len(rels), 1)
res["pass"] = (res["files_a"] == res["files_b"] == res["compared"] == res["token_ids_equal"] > 0
               and res["worst_rel"] < 0.03)
print(json.dumps(res, indent=1))
EOF

smi_on() { nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 200 > "$B/smi-$1.csv" 2>&1 & SMI=$!; }
smi_off() { kill "$SMI" 2>/dev/null; wait "$SMI" 2>/dev/null; }
peak_smi() { awk -F', ' '{if ($3 > m[$2]) m[$2] = $3} END {for (i in m) printf "gpu%s peak %s MiB  ", i, m[i]}' "$B/smi-$1.csv"; }

s_env() {
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv
  nvidia-smi topo -m
  $PY -c 'import torch, transformers, accelerate, safetensors, pyarrow; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), transformers.__version__, accelerate.__version__, safetensors.__version__, pyarrow.__version__)'
  nproc; free -g; df -h /tmp | tail -1
  git -C "$REPO" log -1 --format='%h %s' 2>/dev/null; git -C "$REPO" status --short 2>/dev/null | head -20
}

s_build() {
  # remote/specops_host/fixtures/tiny_verifier.py unchanged, with save_pretrained's shard size raised so that its one-file
  # read-back (.text-model/model.safetensors) holds whatever transformers' default shard size is
  cat > "$B/build.py" <<'PYEOF'
import runpy, sys
from transformers import PreTrainedModel
_save = PreTrainedModel.save_pretrained
def save_pretrained(self, *a, **k):
    k.setdefault("max_shard_size", "1000GB")
    return _save(self, *a, **k)
PreTrainedModel.save_pretrained = save_pretrained
sys.path.insert(0, "remote")
sys.argv = ["remote/specops_host/fixtures/tiny_verifier.py", *sys.argv[1:]]
runpy.run_module("specops_host.fixtures.tiny_verifier", run_name="__main__", alter_sys=True)
PYEOF
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES="" $PY "$B/build.py" "$V" --shape kimi --code tests/fixtures/kimi $SHAPE --overwrite || return 1
  ls -la "$V"; du -sh "$V"; cp "$V/config.json" "$B/verifier-config.json"
}

s_data() {
  $PY - "$V" "$B/data/one" "$ROWS" <<'EOF'
import json, random, sys
sys.path.insert(0, ".")
from pathlib import Path
from specops.synth import write_dataset
v, root, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
vocab = json.load(open(v + "/config.json"))["text_config"]["vocab_size"]
rng = random.Random(0)
rows = []
for _ in range(n):
    L = rng.randint(512, 2048)
    rows.append({"input_ids": [rng.randrange(0, vocab) for _ in range(L)], "loss_mask": [0] * (L // 4) + [1] * (L - L // 4)})
write_dataset(root, rows)
print(f"{n} rows, {sum(len(r['input_ids']) for r in rows)} tokens, ids in [0, {vocab}) -> {root}")
EOF
  for d in two nocap refuse again; do mkdir -p "$B/data/$d"; cp "$B/data/one"/*.arrow "$B/data/one"/*.json "$B/data/$d/"; done
  ls -la "$B/data/one"
}

# extract NAME CUDA_VISIBLE_DEVICES TP [extra datagen args]: one datagen.py run (cap from the caller's env)
extract() {
  local name=$1 cvd=$2 tp=$3; shift 3
  echo "gpu memory before: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | paste -sd/) MiB"
  smi_on "$name"
  (cd "$B/wd" && CUDA_VISIBLE_DEVICES=$cvd KS_REPO=$REPO KS_MAP=$B/devmap-$name.json $PY "$B/wrap.py" \
    --data-dir "$B/data/$name" --verifier "$V" --kind cuda --extract --backend hf --tensor-parallel "$tp" \
    --result "$B/result-$name.json" "$@")
  local rc=$?
  smi_off
  echo "datagen rc=$rc; nvidia-smi: $(peak_smi "$name")"
  cat "$B/result-$name.json"; echo
  say "$name: rc=$rc $(peak_smi "$name")$($PY -c "import json,sys; r=json.load(open(sys.argv[1])); e=r.get('extract') or {}; print('tokens/s', e.get('tokens_per_s'), 'tokens', e.get('tokens'), 'extract s', e.get('seconds'), 'total s', r.get('seconds'), 'device', e.get('device'), r.get('error', ''))" "$B/result-$name.json" 2>/dev/null)"
  [ -f "$B/devmap-$name.json" ] && say "$name: $($PY -c "import json,sys; d=json.load(open(sys.argv[1])); print('layers per device', d['layers_per_device'], 'final norm', d['final_norm'])" "$B/devmap-$name.json")"
  return $rc
}

s_one() { unset SPECOPS_GPU_MEMORY_CAP_GIB; extract one 0 1; }
s_two() { SPECOPS_GPU_MEMORY_CAP_GIB=$CAP extract two 0,1 2; }
s_nocap() { unset SPECOPS_GPU_MEMORY_CAP_GIB; extract nocap 0,1 2 --rows 0:2; }
s_refuse() { SPECOPS_GPU_MEMORY_CAP_GIB=$CAP extract refuse 0,1 1 --rows 0:1; [ $? -eq 2 ]; }
s_again() { unset SPECOPS_GPU_MEMORY_CAP_GIB; extract again 0 1; }
# compare A B: every hs_i of data/A against data/B
compare() {
  [ -d "$B/data/$2/hidden_states" ] || { echo "no data/$2: not run"; return 0; }
  $PY "$B/compare.py" "$B/data/$1" "$B/data/$2" | tee "$B/compare-$1-$2.json"
  say "compare $1 vs $2: $($PY -c "import json; r=json.load(open('$B/compare-$1-$2.json')); print({k: r[k] for k in ('compared', 'token_ids_equal', 'bit_identical', 'worst_rel', 'mean_rel', 'pass')})")"
}
s_compare() { compare one two; compare one again; du -sh "$B"/data/*; }

say "kimi split: $(nvidia-smi -L | wc -l) GPU(s); shape: $SHAPE; rows $ROWS; cap $CAP GiB; $(date -u +%FT%TZ)"
for s in ${STAGES:-env build data one two nocap refuse again compare}; do
  if ! stage "$s" "s_$s"; then
    case $s in build|data|one|two) say "stopping: stage $s failed"; break;; esac
  fi
done
touch "$B/DONE"
