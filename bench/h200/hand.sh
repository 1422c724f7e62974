# Sourced by all.sh and vllm.sh (needs VPY, VENV, WD, B set).
# by_hand RUN OUT [NPROC]: the training `inv train` ran (its run.json's flags) launched by hand in a
# plain shell: `speculators train FLAGS`, or with NPROC > 1 `torchrun --standalone --nproc-per-node
# NPROC -m speculators train FLAGS`; output paths moved to OUT.
by_hand() {
  local run=$1 out=$2 nproc=${3:-1}
  CMD=$($VPY - "$WD/runs/$run/run.json" "$out" "$VENV" "$nproc" <<'EOF'
import json, os, shlex, sys
argv = json.load(open(sys.argv[1]))["command"]
venv, nproc = sys.argv[3], int(sys.argv[4])
if "train" in argv:  # cuda: [torchrun ...] -m speculators train FLAGS
    flags = argv[argv.index("train") + 1:]
    tr = [venv + "/bin/torchrun"] if os.path.exists(venv + "/bin/torchrun") else [venv + "/bin/python3", "-m", "torch.distributed.run"]
    head = ([*tr, "--standalone", "--nproc-per-node", str(nproc), "-m", "speculators", "train"]
            if nproc > 1 else [venv + "/bin/speculators", "train"])
else:  # cpu: python -m specops_host.train.cpu FLAGS (speculators has no CPU placement of its own)
    i = next(i for i, a in enumerate(argv) if a.endswith(".py") or a.startswith("specops_host."))
    head, flags = argv[:i + 1], argv[i + 1:]
out = sys.argv[2]
for k, v in (("--save-path", out + "/checkpoints"), ("--log-dir", out + "/logs"), ("--run-name", "by-hand")):
    flags[flags.index(k) + 1] = v
print(" ".join(shlex.quote(x) for x in [*head, *flags]))
EOF
)
  echo "by hand: $CMD" | tee -a "$B/summary.txt"
  rm -rf "$out"; mkdir -p "$out"
  (cd "$WD" && env -u SPECOPS_HOSTS -u SPECOPS_HOST COLUMNS=1000 bash -c "$CMD") > "$out/output.log" 2>&1
  echo "by hand rc=$?"
}
