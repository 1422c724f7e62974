"""What every vLLM server specops starts runs with (serve/vllm_server.py server_env)."""

import os
from pathlib import Path

import pytest

from specops_host.serve import vllm_server


@pytest.fixture(autouse=True)
def own_venv(tmp_path, monkeypatch):
    """The venv these tests' cache_env shares vLLM's model registry cache in (hostenv.share_modelinfos): theirs."""
    monkeypatch.setattr("sys.prefix", str(tmp_path / "venv"))


def test_a_cpu_servers_model_runs_in_its_engine_process_unless_tensor_parallel_or_the_user_says(tmp_path,
                                                                                              monkeypatch):
    monkeypatch.delenv(vllm_server.UNI_VAR, raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    one = vllm_server.server_env(tmp_path, "cpu", 1)
    assert one[vllm_server.UNI_VAR] == "0" and "VLLM_CPU_OMP_THREADS_BIND" not in one
    # (its model's threads as vLLM's own binding counts them: every core but one, at least one)
    assert one["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) - 1))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # (the user's: kept, not overwritten)
    assert "OMP_NUM_THREADS" not in vllm_server.server_env(tmp_path, "cpu", 1)
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv(vllm_server.UNI_VAR, "0")  # (the user's own uni executor: the same threads)
    assert vllm_server.server_env(tmp_path, "cpu", 1)["OMP_NUM_THREADS"] == one["OMP_NUM_THREADS"]
    monkeypatch.delenv(vllm_server.UNI_VAR)
    two = vllm_server.server_env(tmp_path, "cpu", 2)
    assert vllm_server.UNI_VAR not in two and two["VLLM_CPU_OMP_THREADS_BIND"]  # (a process per rank, its cores)
    assert vllm_server.UNI_VAR not in vllm_server.server_env(tmp_path, "cuda", 1)
    monkeypatch.setenv(vllm_server.UNI_VAR, "1")  # (the user's, e.g. hosts.yaml env: kept)
    user_mp = vllm_server.server_env(tmp_path, "cpu", 1)
    assert vllm_server.UNI_VAR not in user_mp and "OMP_NUM_THREADS" not in user_mp  # (vLLM's own binding then)


def test_every_host_process_has_openmps_threads_wait_asleep_unless_the_user_says(tmp_path):
    """specops_host sets OMP_WAIT_POLICY=PASSIVE when it loads (before any script imports torch), so the vLLM
    server, the trainer and speculators' scripts it starts inherit it; a user's own value is kept. Real
    processes: a host script's interpreter, and what it starts (torch's OpenMP reads it at load)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    remote = str(Path(__file__).resolve().parent.parent / "remote")
    code = ("import os, subprocess, sys, specops_host; print(os.environ['OMP_WAIT_POLICY']); "
            "sys.stdout.flush(); subprocess.run([sys.executable, '-c', "
            "'import os; print(os.environ[\"OMP_WAIT_POLICY\"])'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = remote
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.split() == ["PASSIVE", "PASSIVE"], out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.split() == ["ACTIVE", "ACTIVE"], out.stdout + out.stderr


def test_a_cpu_servers_kv_cache_is_sized_to_its_model_unless_the_user_sizes_it(tmp_path, monkeypatch):
    """vllm-cpu zeroes its whole KV cache at each start: specops sizes it from the model's config (KV_SEQS requests of
    the server's length in float32), not vllm-cpu's 1 GiB; the user's --kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE
    wins, and a config that says too little (MLA's compressed cache, no heads) keeps 1 GiB."""
    import json

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    small, smol, mla = (tmp_path / n for n in ("small", "smol", "mla"))
    for d, cfg in ((small, {"num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
                            "hidden_size": 128, "head_dim": 64, "max_position_embeddings": 2048}),
                   (smol, {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                           "hidden_size": 576, "max_position_embeddings": 8192}),
                   (mla, {"text_config": {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
                                          "kv_lora_rank": 32, "max_position_embeddings": 512}})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_server.server_env(tmp_path, "cpu", 1)
    assert vllm_server.cpu_kv_bytes(small) == vllm_server.KV_MIN  # (4 x 1 x 64 x 2 x 4 bytes x 2,048 x 8: 16 MiB)
    assert vllm_server.cpu_kv_bytes(smol) == vllm_server.KV_MAX  # (its 8,192 positions: 3.4 GB, at most 1 GiB)
    assert vllm_server.cpu_kv_bytes(smol, 512) == 2 * 30 * 3 * 64 * 4 * 512 * 8  # (its server's length: 180 MiB)
    assert vllm_server.cpu_kv_bytes(mla) == vllm_server.cpu_kv_bytes(tmp_path / "none") == vllm_server.KV_MAX
    argv = vllm_server.server_argv(smol, 8000, kind="cpu", max_model_len=512)
    assert argv.count(f"--kv-cache-memory-bytes={2 * 30 * 3 * 64 * 4 * 512 * 8}") == 1, argv
    mine = vllm_server.server_argv(smol, 8000, kind="cpu", user_args=["--kv-cache-memory-bytes=1000000000",
                                                                      "--max-model-len=256"])
    assert [a for a in mine if a.startswith("--kv")] == ["--kv-cache-memory-bytes=1000000000"], mine
    longer = vllm_server.server_argv(smol, 8000, kind="cpu", max_model_len=512, user_args=["--max-model-len=1024"])
    assert f"--kv-cache-memory-bytes={2 * 30 * 3 * 64 * 4 * 1024 * 8}" in longer  # (the user's length: it serves)
    assert not any(a.startswith("--kv") for a in vllm_server.server_argv(smol, 8000, kind="cuda"))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # (vllm-cpu's own setting, in GiB: it wins, nothing added)
    assert not any(a.startswith("--kv") for a in vllm_server.server_argv(smol, 8000, kind="cpu"))


def test_vllms_model_registry_cache_is_the_venvs_for_every_workdir(tmp_path, monkeypatch):
    """vLLM's model registry inspects a model class in a subprocess at a server's start unless VLLM_CACHE_ROOT/
    modelinfos holds it (keyed by the hash of vLLM's module): each workdir's cache links to the venv's one folder,
    so a new workdir reads what an earlier one learnt; a workdir's own folder is kept; each user its own folder."""
    from specops_host import hostenv

    venv = tmp_path / "venv"
    a, b, own = (tmp_path / n / "vllm" for n in ("a", "b", "own"))
    (own / "modelinfos").mkdir(parents=True)
    for d in (a, b, own):
        d.mkdir(parents=True, exist_ok=True)
        hostenv.share_modelinfos(d, venv)
    shared = venv / f"specops-cache-{os.geteuid()}" / "vllm-modelinfos"
    assert (a / "modelinfos").resolve() == (b / "modelinfos").resolve() == shared.resolve() and shared.is_dir()
    (a / "modelinfos" / "x.json").write_text("{}")
    assert (b / "modelinfos" / "x.json").exists() and not (own / "modelinfos").is_symlink()
    hostenv.share_modelinfos(a, tmp_path / "other")  # (linked already: left as it is)
    assert (a / "modelinfos").resolve() == shared.resolve()
    c = tmp_path / "c" / "vllm"  # (another user on this venv, root running it say: a folder of its own there)
    c.mkdir(parents=True)
    monkeypatch.setattr("os.geteuid", lambda: os.getuid() + 1)
    hostenv.share_modelinfos(c, venv)
    assert (c / "modelinfos").resolve() == (venv / f"specops-cache-{os.getuid() + 1}" / "vllm-modelinfos").resolve()
    assert not (c / "modelinfos" / "x.json").exists()
    monkeypatch.undo()
    monkeypatch.setattr("sys.prefix", str(venv))
    env = hostenv.cache_env(tmp_path / "work", "cpu")
    assert (Path(env["VLLM_CACHE_ROOT"]) / "modelinfos").is_symlink()
