"""Extraction by hand, with the flags `inv extract` used: the peer of bench 2a (issue 21).

    cd WORKDIR && /opt/torch/.venv/bin/python3 REPO/bench/h200/hand_extract.py \\
        SPECOPS_LOG FROM_DATASET TO_DATASET OUT.json

Reads the two commands specops printed in SPECOPS_LOG (an `inv extract` output: the vLLM server's
`[specops] vLLM server: $ ...` line and the `[specops] $ ... generate-offline-data ...` line), moves
them from FROM_DATASET to TO_DATASET (a copy of the same prepared rows, no hidden states) and a
port of its own, then does what a person does by hand: starts that server in a shell of its own,
waits for GET /health, runs `speculators generate-offline-data`, stops the server. The server's
environment is the one specops gives it (the caches under the workdir), so the two differ only in
who drives (EXTRA_SERVER_ARGS adds server flags). Writes {server_start_s, generate_s, wall_s} to OUT.json. Bench
tooling, not specops.
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def commands(log, src, dst, port):
    server = gen = None
    for line in open(log, errors="replace"):
        line = line.rstrip("\n")
        if "[specops] vLLM server: $ " in line:
            server = shlex.split(line.split("[specops] vLLM server: $ ", 1)[1])
        elif "[specops] $ " in line and "generate-offline-data" in line:
            gen = line.split("[specops] $ ", 1)[1].split()
    if not server or not gen:
        sys.exit(f"hand_extract: {log} has no server or generate-offline-data line")
    old_port = server[server.index("--port") + 1]

    def move(argv):
        return [a.replace(src, dst).replace(f"127.0.0.1:{old_port}", f"127.0.0.1:{port}") for a in argv]

    server = move(server)
    server[server.index("--port") + 1] = str(port)
    return server, move(gen)


def main():
    log, src, dst, out = sys.argv[1:5]
    src, dst = src.rstrip("/"), dst.rstrip("/")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, gen = commands(log, src, dst, port)
    server += shlex.split(os.environ.get("EXTRA_SERVER_ARGS", ""))  # e.g. --enforce-eager: its start, compared
    sys.path.insert(0, str(REPO / "remote"))
    from specops_host.serve import vllm_server  # the environment specops gives its servers (caches under the workdir)

    env = {**os.environ, **vllm_server.server_env(os.getcwd(), "cuda")}
    Path(dst, ".hs_stage").mkdir(exist_ok=True)
    print("by hand: $", shlex.join(server), flush=True)
    t0 = time.time()
    slog = open(Path(dst).parent / (Path(dst).name + "-server.log"), "w")
    proc = subprocess.Popen(server, env=env, stdout=slog, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                sys.exit(f"hand_extract: the server exited {proc.returncode} (log {slog.name})")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        started = time.time() - t0
        print(f"by hand: healthy after {started:.1f}s; $", " ".join(gen), flush=True)
        t1 = time.time()
        rc = subprocess.call(gen, stdin=subprocess.DEVNULL)
        gen_s = time.time() - t1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    res = {"server_start_s": round(started, 1), "generate_s": round(gen_s, 2), "wall_s": round(time.time() - t0, 1),
           "rc": rc, "server": server, "generate": gen}
    json.dump(res, open(out, "w"), indent=1)
    print(json.dumps({k: v for k, v in res.items() if k not in ("server", "generate")}), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
