"""What every vLLM server specops starts runs with (serve/vllm_server.py server_env)."""

from specops_host.serve import vllm_server


def test_a_cpu_servers_model_runs_in_its_engine_process_unless_tensor_parallel_or_the_user_says(tmp_path,
                                                                                              monkeypatch):
    monkeypatch.delenv(vllm_server.UNI_VAR, raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    one = vllm_server.server_env(tmp_path, "cpu", 1)
    assert one[vllm_server.UNI_VAR] == "0" and "VLLM_CPU_OMP_THREADS_BIND" not in one
    two = vllm_server.server_env(tmp_path, "cpu", 2)
    assert vllm_server.UNI_VAR not in two and two["VLLM_CPU_OMP_THREADS_BIND"]  # (a process per rank, its cores)
    assert vllm_server.UNI_VAR not in vllm_server.server_env(tmp_path, "cuda", 1)
    monkeypatch.setenv(vllm_server.UNI_VAR, "1")  # (the user's, e.g. hosts.yaml env: kept)
    assert vllm_server.UNI_VAR not in vllm_server.server_env(tmp_path, "cpu", 1)
