# Sourced by bench/h200/vllm.sh, bench/h200/kimi_split.sh (say, stage) and bench/gpu/*.sh (run from the repo
# root on the GPU machine): the wheelhouse joined from its parts and specops' laptop side beside the machine's
# torch venv; a run's environment, its summary line (say) and stages (stage), the CPU dry run's hosts.yaml
# (cpu_hosts). Uses W (the wheelhouse), VPY (the torch venv's python3), VENV, WD (the workdir), B (the run's
# folder), INV (/tmp/lap/bin/inv).

join_wheelhouse() {  # PARTS: the wheelhouse's 56 MiB parts, joined into $W once
  [ -f "$W/specops-wheelhouse.json" ] || cat "$1"/part-* | tar xf - -C /tmp
}

laptop_side() {  # /tmp/lap and $B/hosts.yaml (the machine's `local` host on the torch venv), then `inv hosts`
  rm -rf /tmp/lap
  # specops' own dependencies that the torch venv lacks (laptop/ holds only those), the torch venv's packages
  # behind them (a .pth), so no second numpy/matplotlib/tensorboard travels
  $VPY -m venv --without-pip /tmp/lap
  local sp; sp=$(/tmp/lap/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  $VPY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$sp/zz-torch-venv.pth"
  # specops itself from this checkout, not installed: its laptop side imports the host package (remote/) too
  # (without it, 2026-12-06: `inv hosts` failed "cannot import name 'contract' from 'specops_host'")
  printf '%s\n%s\n' "$PWD" "$PWD/remote" > "$sp/specops-checkout.pth"
  $VPY -m pip --python /tmp/lap/bin/python3 install -q --no-index --no-deps "$W"/laptop/*.whl || return 1
  cat > "$B/hosts.yaml" <<HOSTS
hosts:
  local:
    transport: local
    profile: cuda
    venv: $VENV
    venv_existing: true
    workdir: $WD
    gpus: 1
HOSTS
  $INV hosts
}

gpu_run_env() {  # what every run on the GPU machine exports (NVLink multicast off: the device's KINDS.md)
  export SPECOPS_HOSTS=$B/hosts.yaml SPECOPS_HOST=local PYTHONUNBUFFERED=1 COLUMNS=200 CI=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

say() { echo "[$(date +%T)] $*" | tee -a "$B/summary.txt"; }

stage() {  # NAME CMD...: CMD's output in $B/NAME.log, its start and rc in the summary (stage_note, if defined, adds to the start)
  local name=$1; shift
  say "== $name: start$(declare -F stage_note >/dev/null && stage_note)"
  local t0=$SECONDS
  ( set -x; "$@" ) > "$B/$name.log" 2>&1
  local rc=$?
  say "== $name: rc=$rc in $((SECONDS - t0))s"
  return $rc
}

cpu_hosts() {  # the CPU dry run's $B/hosts.yaml (the `local` host on VENV, profile cpu: nothing joined or installed)
  printf 'hosts:\n  local:\n    transport: local\n    profile: cpu\n    venv: %s\n    venv_existing: true\n    workdir: %s\n' \
    "$VENV" "$WD" > "$B/hosts.yaml"
  $INV hosts
}
