"""Environment for the heavy programs specops starts on a host: every cache inside the workdir
(HF, datasets, vLLM, inductor, triton, tmp; vLLM's model registry cache, keyed by vLLM's own module
hashes, the venv's: share_modelinfos), no model hub unless the user enables it; OpenMP's waiting
threads asleep (THREADS)."""

import os
import sys
from pathlib import Path

#: set in every specops_host process before torch loads OpenMP (specops_host/__init__.py), so in everything it
#: starts (the vLLM server, the trainer, speculators' scripts), unless the user set it: OpenMP's threads wait
#: asleep, not spinning. A spinning thread holds its core while another process needs it: a cpu host runs a vLLM
#: server beside a trainer (online hidden states) or beside another job, and with more threads than cores a
#: small model's steps (a wait at every parallel region) ran 30-200x slower: 3 processes of 3,000 small torch
#: matmuls each on 2 cores took 500-522 s spinning, 0.9-2.5 s asleep (2026-12-06, a loaded 2-core host).
THREADS = {"OMP_WAIT_POLICY": "PASSIVE"}


def quiet_threads(environ=os.environ):
    """THREADS into environ where the user has not set them."""
    for k, v in THREADS.items():
        environ.setdefault(k, v)


def short_dir(p, name):
    """Unix sockets live under these (vLLM's IPC, multiprocessing in prepare-data): a socket
    path must stay under 107 bytes, so a deep workdir gets a short private dir in /tmp."""
    if len(str(p)) + 45 <= 107:
        return str(p)
    short = Path(f"/tmp/specops-{name}-{os.getuid()}")
    short.mkdir(mode=0o700, exist_ok=True)
    return str(short)


def rpc_dir(cache):
    return short_dir(cache / "rpc", "rpc")


def cache_env(workdir, kind="cpu"):
    cache = Path(workdir).resolve() / ".specops" / "cache"
    env = {
        "HF_HOME": str(cache / "hf"), "HF_DATASETS_CACHE": str(cache / "hf" / "datasets"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        "VLLM_CACHE_ROOT": str(cache / "vllm"), "VLLM_CONFIG_ROOT": str(cache / "vllm-config"),
        "VLLM_ASSETS_CACHE": str(cache / "vllm-assets"), "VLLM_RPC_BASE_PATH": rpc_dir(cache),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton"),
        "TMPDIR": short_dir(cache / "tmp", "tmp"), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
    }
    if kind != "cpu":  # (a cpu host's KV cache: sized per model, vllm_server.cpu_kv_args)
        # FlashInfer's JIT-built kernels kept with the other caches (a later server start reuses them); its
        # sampler, compiled at the first start (about two minutes on an H200), is left out: greedy decoding
        # (every stage specops serves) never samples, so the figures do not change
        env["FLASHINFER_WORKSPACE_BASE"] = str(cache / "flashinfer")
        env["VLLM_USE_FLASHINFER_SAMPLER"] = os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "0")
    for k in ("HF_HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TMPDIR", "VLLM_RPC_BASE_PATH"):
        Path(env[k]).mkdir(parents=True, exist_ok=True)
    share_modelinfos(Path(env["VLLM_CACHE_ROOT"]))
    return env


def share_modelinfos(vllm_cache, venv=None):
    """VLLM_CACHE_ROOT/modelinfos a link to the venv's own for this user (VENV/specops-cache-UID/vllm-modelinfos):
    what vLLM's model registry learns of a model class in a subprocess (about 6 CPU-s and as many seconds a class, at
    each server's start in a new workdir: 19 times a test suite), saved under the hash of the vLLM module it read, so
    any workdir of this venv and user reads it. A folder a user (root running another's venv, say) shared with the
    venv's owner held files vLLM writes 0600, which the owner cannot read, and the owner's failed save was logged as
    an exception that a failed server's log then named as its root error: each user a folder of its own, made in
    the venv's top folder (one user's folder never blocks another's). A workdir's own folder is kept; a venv this
    user cannot write to shares nothing."""
    link = Path(vllm_cache) / "modelinfos"
    if link.is_symlink() or link.exists():
        return
    shared = Path(venv or sys.prefix) / f"specops-cache-{os.geteuid()}" / "vllm-modelinfos"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        link.symlink_to(shared, target_is_directory=True)
    except OSError:  # (a venv this user cannot write to, or another process linked it first)
        pass


def apply(workdir, kind="cpu"):
    """Set the cache environment for this process (and what it starts), keeping user overrides."""
    for k, v in cache_env(workdir, kind).items():
        os.environ.setdefault(k, v)
