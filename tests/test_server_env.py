"""What every vLLM server specops starts runs with (serve/vllm_server.py server_env)."""

import os

from specops_host.serve import vllm_server


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
