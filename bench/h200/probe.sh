#!/bin/bash
# First look at the H200 machine (no specops yet): the preinstalled venv, its packages, the GPU.
# Writes $OUT/freeze.txt (pip list --format=freeze of `python3`, input to `inv wheelhouse --have`)
# and $OUT/probe.txt.
exec > >(tee "$OUT/probe.txt") 2>&1
set -x
which python3 rsync setsid ssh git
python3 -c 'import sys; print(sys.executable, sys.prefix, sys.base_prefix, sys.version)'
cat /opt/torch/.venv/pyvenv.cfg; ls -la /opt/torch/.venv/bin | head -20
python3 -m pip --version
python3 -m pip list --format=freeze > "$OUT/freeze.txt"; wc -l "$OUT/freeze.txt"
python3 -c 'import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, torch.cuda.get_device_name(0))'
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
df -h / /tmp "$HOME"; free -g; nproc; uname -a; id; echo "HOME=$HOME"
env | grep -E '^(NCCL|TORCH|NVSHMEM|CUDA|PYTHON|PIP|VIRTUAL_ENV|PATH)' | sort
test -w /opt/torch/.venv/lib/python3.12/site-packages && echo site-packages-writable
