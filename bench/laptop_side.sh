# Sourced by bench/h200/vllm.sh and bench/gpu/smollm2.sh (run from the repo root on the GPU machine): the
# wheelhouse joined from its parts and specops' laptop side beside the machine's torch venv. Uses W (the
# wheelhouse), VPY (the torch venv's python3), VENV, WD (the workdir), B (the run's folder), INV (/tmp/lap/bin/inv).

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
