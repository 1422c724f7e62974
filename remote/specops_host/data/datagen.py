"""The data stage on this host: prepare-data, then hidden-state extraction (vLLM or HF).

Launch (what `inv prepare-data` / `inv extract` send, from the host workdir; `--plan` first,
synchronously, then the same arguments without it as a detached job):
    <venv>/bin/python3 -m specops_host.data.datagen --data-dir data/default --verifier /models/V --kind cuda \
        [--prepare convs.jsonl --seq-length 2048] \
        [--extract --backend vllm|hf --layers 2,30,58,61 --shard 0/4 | --rows 0:2000] \
        [--tensor-parallel 8] [--trust-remote-code auto|true|false] [--vllm-arg=ARG ...] \
        [--max-model-len N] [--plan [--prepare-later]] [--result runs/R/result.json]

--plan validates everything (verifier config, layer ids, shard, inputs, the disk budget, the
vLLM arguments) and changes nothing; its payload holds `commands`: the argv of every process
the run would start, in order (the vLLM server's port shows as <port>: it is picked at start).
Without it: prepare runs `speculators prepare-data` (a vLLM render server is started when rows
are conversations: vLLM's GPU-less one, serve/render_server.py, where the run extracts no hidden states through vLLM
and this vLLM has it; else the whole server); extract runs a vLLM server with the `extract_hidden_states` speculative
config and a hidden-states connector (cpu hosts: the CPU-safe one in
remote/specops_host/serve/cpu_hs_connector.py) plus `speculators generate-offline-data --validate-outputs`, or a
transformers forward (`--backend hf`) writing identical files. Existing readable files are
skipped. The server is stopped by its process group whatever happens (SIGTERM and Ctrl-C
included). Its job folder is RUN/server, its connector's staging folder DATA/.hs_stage; with
--shard i/n, RUN/server-i and DATA/.hs_stage-i-of-n (the tasks of a Slurm job array share the
run folder and the data dir, each with its own server).

Every loader gets the same trust_remote_code (vLLM, prepare-data, transformers): `auto` = on
when the verifier ships its own code (`auto_map`). The server spans --tensor-parallel GPUs and
gets --max-model-len = the longest row + 1 (the one token vLLM generates) unless given: the
prepared dataset's longest row, or --seq-length when the rows are prepared in the same run.
--vllm-arg (repeatable; `--vllm-arg=--flag` keeps a leading dash a value) goes last on every
server, after specops' own arguments.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from specops_host import contract
from specops_host.serve import render_server, vllm_server
from specops_host.contract import Refused, emit, human_bytes
from specops_host.datafmt import RECORD, check_model_len, hs_files, read_arrow_columns, verifier_config
from specops_host.data.hsfile import readable
from specops_host.data.inputs import (HEADROOM, check_layers_against_files, check_prepare_source, check_rows,
                                      free_bytes, parse_layers, parse_range, read_record, refuse_if_in_use,
                                      rows_need_render)
from specops_host.jobs.errlines import first_error

PORT = "<port>"  # (in a plan's commands: the server's port is picked when it starts)


def plan(a):
    """Everything checkable before anything starts. Raises Refused."""
    if not a.verifier:
        raise Refused("no verifier: set `verifier:` for the host in hosts.yaml or pass --verifier PATH")
    vc = verifier_config(a.verifier)
    if vc is None:
        raise Refused(f"verifier {a.verifier}: no config.json there (a HF model directory is needed)")
    hidden, n = vc
    if a.tensor_parallel < 1:
        raise Refused(f"--tensor-parallel {a.tensor_parallel}: give 1 or more (GPUs one vLLM server spans)")
    if a.max_model_len is not None and a.max_model_len < 2:
        raise Refused(f"--max-model-len {a.max_model_len}: give the longest row + 1 or more")
    vllm_server.check_user_args(a.vllm_arg)
    out = {"verifier": a.verifier, "hidden_size": hidden, "num_hidden_layers": n, "data_dir": a.data_dir,
           "trust_remote_code": vllm_server.decide_trust(a.verifier, a.trust_remote_code),
           "custom_code": vllm_server.custom_code(a.verifier), "tensor_parallel": a.tensor_parallel,
           "vllm_args": list(a.vllm_arg)}
    data = Path(a.data_dir)
    refuse_if_in_use(a, data)
    longest = None
    if a.prepare and a.prepare_later and not Path(a.prepare).exists():
        out["prepare_later"] = True  # (a dry run: the laptop's file is uploaded before the real run)
    elif a.prepare:
        if not Path(a.prepare).exists():
            raise Refused(f"--prepare {a.prepare}: no such file on this host")
        out["already_prepared"], out["prepare_sha256"] = check_prepare_source(a, data)
        out["needs_render_server"] = rows_need_render(a.prepare)
        if not out["already_prepared"]:
            out["source_rows"] = check_rows(a.prepare, a.verifier)
    if a.extract:
        out["layer_ids"] = parse_layers(a.layers, n)
        check_layers_against_files(a, data, out["layer_ids"])
        if a.backend == "vllm" and a.rows:
            raise Refused("--rows is for --backend hf; the vllm backend splits with --shard i/n")
        if (data / "state.json").is_file():
            seq = read_arrow_columns(data, ["seq_len"])["seq_len"]
            longest = max(seq, default=None)
            start, end = parse_range(a.shard, a.rows, len(seq))
            have = hs_files(data)
            todo = [i for i in range(start, end) if not (i in have and readable(have[i]))]
            tokens = sum(seq[i] for i in todo)
            need = tokens * len(out["layer_ids"]) * hidden * 2
            free = free_bytes(data)
            out.update(rows=[start, end], todo=len(todo), done=(end - start) - len(todo), tokens=tokens,
                       estimate_bytes=need, free_bytes=free)
            print(f"[specops] disk budget: {tokens} tokens x {len(out['layer_ids'])} layers x {hidden} hidden x "
                  f"2 B = {human_bytes(need)} needed (+10%), {human_bytes(free)} free at {data}", flush=True)
            if need * HEADROOM > free:
                raise Refused(f"extraction needs {human_bytes(need)} (+10% headroom = {human_bytes(need * HEADROOM)}) "
                              f"but only {human_bytes(free)} is free at {data.resolve()}: free space, shard the rows, "
                              f"or move the data dir")
        elif not a.prepare:
            raise Refused(f"{data}: no prepared dataset (state.json): run `inv prepare-data` first")
    why = None
    if a.max_model_len:
        out["max_model_len"], why = a.max_model_len, f"--max-model-len {a.max_model_len}"
    elif longest and not (a.prepare and not out.get("already_prepared")):
        out["max_model_len"] = longest + 1  # (the longest row + the one token vLLM generates)
        why = f"the longest prepared row ({longest} tokens) + 1 (the token vLLM generates)"
    elif a.prepare:
        out["max_model_len"], why = a.seq_length + 1, f"--seq-length {a.seq_length} + 1 (the token vLLM generates)"
    else:
        out["max_model_len"] = None
    if needs_server(a, out):  # (before any server starts: vLLM's own refusal is a traceback in its log)
        check_model_len(out["max_model_len"], a.verifier, why)
    out["commands"] = commands(a, out)
    return out


def needs_server(a, info):
    return bool((a.prepare and info.get("needs_render_server", True) and not info.get("already_prepared"))
                or (a.extract and a.backend == "vllm"))


def hs_stage(a):
    """The server's staging folder in the data dir (its connector writes each row there, speculators
    moves it into hidden_states/), one per shard as its job folder is (server_name): a job array's
    tasks (one data dir and run folder, a server each) never share one, nor clear each other's."""
    return Path(a.data_dir) / (f".hs_stage-{a.shard.replace('/', '-of-')}" if a.shard else ".hs_stage")


def server_name(a):
    return f"server-{a.shard.split('/')[0]}" if a.shard else "server"


def server_cmd(a, info, port):
    """The run's one server: for a prepare alone (no vLLM extraction), vLLM's GPU-less render server where this vLLM
    has it (what prepare-data asks of a server is its render endpoint: no weights loaded, no engine); else the
    whole server, extracting where --extract --backend vllm asks."""
    if not (a.extract and a.backend == "vllm") and render_server.has_render():
        return render_server.render_argv(a.verifier, port, max_model_len=info.get("max_model_len"),
                                         trust_remote_code=info["trust_remote_code"], user_args=a.vllm_arg)
    return vllm_server.server_argv(
        a.verifier, port, kind=a.kind, layer_ids=info["layer_ids"] if a.extract and a.backend == "vllm" else None,
        stage=hs_stage(a), max_model_len=info.get("max_model_len"),
        tensor_parallel=a.tensor_parallel, trust_remote_code=info["trust_remote_code"],
        extra=vllm_server.prefill_only(a.kind, a.vllm_arg), user_args=a.vllm_arg)


def beside(data):
    """Where prepare-data builds the dataset: a hidden folder beside it, moved in at the end (a
    failed or interrupted prepare leaves nothing in the dataset folder that blocks the re-run)."""
    data = Path(data)
    return data.parent / f".{data.name}.preparing"


def publish(stage, data, overwrite, source):
    """The built dataset into its folder: what was there goes only now (with --overwrite all of
    it but the --prepare source; else what the new files replace), then each entry is renamed in
    (same filesystem: no copy), the stage removed."""
    names = {p.name for p in stage.iterdir()}
    source = Path(source).resolve()
    for p in list(data.iterdir()):
        if (overwrite or p.name in names) and not (source == p.resolve() or p.resolve() in source.parents):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in list(stage.iterdir()):
        os.replace(p, data / p.name)
    stage.rmdir()


def prepare_cmd(a, info, url):
    argv = [sys.executable, "-m", "speculators", "prepare-data", "--model", a.verifier,
            "--data", a.prepare, "--output", str(beside(a.data_dir)), "--seq-length", str(a.seq_length),
            "--no-skip-token-freq"]
    if info["trust_remote_code"]:
        argv += ["--trust-remote-code"]
    if info.get("needs_render_server", True):
        argv += ["--render-endpoint", url]
    return argv


def generate_cmd(a, url, concurrency=None):
    argv = [sys.executable, "-m", "speculators", "generate-offline-data", "--endpoint", f"{url}/v1",
            "--model", a.verifier, "--preprocessed-data", str(a.data_dir), "--concurrency",
            str(concurrency or a.concurrency), "--validate-outputs", "--fail-on-error"]
    if a.shard:
        i, n = a.shard.split("/")
        argv += ["--world-size", n, "--rank", i]
    return argv


def commands(a, info, port=PORT):
    """The argv of every process the run starts, in order (the plan shows them; execute runs
    exactly these). A --prepare file not uploaded yet (--prepare-later) counts as conversations."""
    url = f"http://127.0.0.1:{port}"
    out = []
    if needs_server(a, info):
        out.append(server_cmd(a, info, port))
    if a.prepare and not info.get("already_prepared"):
        out.append(prepare_cmd(a, info, url))
    if a.extract and a.backend == "vllm":
        out.append(generate_cmd(a, url))
    return out


def run_cmd(argv, env=None, keep=1 << 16):
    """Run argv, its output into this job's log as it comes; a failure is StepFailed with the
    program's own error line (`ValueError: ...`, `OSError: [Errno 28] No space left on device`) and
    its log's tail (`.tail`)."""
    print(f"[specops] $ {' '.join(argv)}", flush=True)
    t0 = time.time()
    p = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tail = b""
    while chunk := os.read(p.stdout.fileno(), 1 << 16):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        tail = (tail + chunk)[-keep:]
    rc = p.wait()
    if rc != 0:
        text = tail.decode(errors="replace")
        why = first_error(text)
        err = vllm_server.StepFailed(f"{' '.join(argv[2:4])} exited {rc}" + (f": {why}" if why else ""))
        err.tail = text
        raise err
    return time.time() - t0


#: tries of generate-offline-data while it dies of speculators' fixed wait (10 s, no flag sets it) for a
#: hidden-states file's lock: vLLM's connector holds it until the file is written, at the end of the engine's next
#: step, and on a loaded host (2 shared cores) a step of many rows' prefill takes longer (at load 13 the first row
#: of 48 failed so, at --concurrency 32). Each try resumes (speculators skips the files written) with a quarter of
#: the rows in flight (so shorter steps).
LOCK_TRIES = 4


def lock_wait(text):
    """Whether a failed generate-offline-data's log ends in speculators' lock wait timing out (its traceback as
    plain text or as rich's wrapped log: spacing aside)."""
    flat = "".join(text.split())
    return "TimeoutError" in flat and ",inwait_for_lock" in flat


def generate(argv_of, concurrency, tries=LOCK_TRIES, count=None):
    """run_cmd(argv_of(concurrency)), again (up to `tries` in all, each with a quarter of the concurrency, at least
    1) while it fails on the lock wait alone, each retry said; count(): the files written so far. Returns its
    seconds, all tries."""
    t0, n = time.time(), 1
    while True:
        try:
            run_cmd(argv_of(concurrency))
            return time.time() - t0
        except vllm_server.StepFailed as e:
            if not lock_wait(getattr(e, "tail", "")):
                raise
            what = ("speculators' fixed 10 s wait for a hidden-states file's lock ran out (the host is loaded: the "
                    "file's write came later)")
            if n == tries:
                raise vllm_server.StepFailed(f"speculators generate-offline-data failed {tries} times: {what}; run it "
                                             f"again when the host is less busy (the files written are kept)") from None
            n, concurrency = n + 1, max(1, concurrency // 4)
            kept = f"; {count()} file(s) written are kept" if count else ""
            print(f"[specops] {what}: try {n} of {tries}, resuming at --concurrency {concurrency}{kept}", flush=True)


def execute(a, info):
    data = Path(a.data_dir)
    made = not data.exists()
    data.mkdir(parents=True, exist_ok=True)
    run_dir = Path(a.result).parent if a.result else data
    res = {"steps": []}
    stage = beside(data)
    preparing = a.prepare and not info.get("already_prepared")
    if preparing:
        shutil.rmtree(stage, ignore_errors=True)  # (an earlier run's, interrupted)
    if a.overwrite and preparing:
        print(f"[specops] --overwrite: the dataset is built beside {data} ({stage.name}) and replaces it at "
              f"the end", flush=True)
    elif a.overwrite and a.extract and (data / "hidden_states").is_dir():  # only the states go, first
        shutil.rmtree(data / "hidden_states")
        print(f"[specops] --overwrite: cleared {data}/hidden_states for the new run", flush=True)
    try:
        return run_steps(a, info, data, run_dir, res, stage)
    except BaseException:  # (nothing of a failed run blocks the next: no stage, no empty folder)
        if preparing:
            shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(hs_stage(a), ignore_errors=True)  # (the server's staging; it is stopped)
        if made and data.is_dir() and not any(data.iterdir()):
            data.rmdir()
        raise
    finally:  # (the server is stopped: what its stage still holds is an aborted try's, never moved)
        shutil.rmtree(hs_stage(a), ignore_errors=True)


def run_steps(a, info, data, run_dir, res, stage):
    server = None
    url = None
    try:
        if needs_server(a, info):
            port = vllm_server.free_port()
            env = vllm_server.server_env(os.getcwd(), a.kind, a.tensor_parallel)
            hs_stage(a).mkdir(exist_ok=True)
            server = vllm_server.start(run_dir, server_cmd(a, info, port), env, port, a.server_timeout,
                                       name=server_name(a))
            url = f"http://127.0.0.1:{port}"
        if a.prepare:
            if info.get("already_prepared"):
                print(f"[specops] {data} already holds this file's dataset (same sha256 and seq length): "
                      f"prepare-data skipped", flush=True)
            else:
                res["prepare_seconds"] = round(run_cmd(prepare_cmd(a, info, url)), 1)
                publish(stage, data, a.overwrite, a.prepare)
                rec = read_record(data)
                rec["prepared_from"] = {"path": os.path.abspath(a.prepare), "sha256": info.get("prepare_sha256"),
                                        "seq_length": a.seq_length, "when": time.time()}
                contract.write_json(data / RECORD, rec)
            res["steps"].append("prepare")
        if a.extract:
            # now that the dataset exists: rows, budget (refuses if too big); the commands and the
            # server's arguments stay those of the plan (they are what ran)
            fresh = plan(a)
            info.update({k: v for k, v in fresh.items()
                         if k not in ("commands", "max_model_len", "already_prepared", "needs_render_server")})
            start, end = info["rows"]
            if a.backend == "vllm":
                secs = generate(lambda c: generate_cmd(a, url, c), a.concurrency, count=lambda: len(hs_files(data)))
                res["extract"] = {"tokens": info["tokens"], "seconds": round(secs, 2),
                                  "tokens_per_s": round(info["tokens"] / secs, 1) if secs > 0 else None}
            else:
                from specops_host.data.hf_backend import hf_extract  # (transformers: only for this backend)

                res["extract"] = hf_extract(data, a.verifier, info["layer_ids"], start, end, a.kind,
                                            trust=info["trust_remote_code"], tensor_parallel=a.tensor_parallel)
            res["steps"].append("extract")
            rec_path = data / RECORD
            rec = read_record(data)
            rec.update(verifier=os.path.abspath(a.verifier), layer_ids=info["layer_ids"],
                       stored_layers=len(info["layer_ids"]), hidden_size=info["hidden_size"],
                       backend=a.backend, trust_remote_code=info["trust_remote_code"], updated=time.time())
            contract.write_json(rec_path, rec)  # (whole or not at all)
    finally:
        if server is not None:
            vllm_server.stop(server)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--verifier", default=None)
    ap.add_argument("--kind", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--prepare", default=None, help="conversation/pre-tokenised .jsonl to prepare")
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--extract", action="store_true")
    ap.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--layers", default=None)
    ap.add_argument("--shard", default=None)
    ap.add_argument("--rows", default=None)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="vLLM --max-model-len (default: the longest row + 1)")
    ap.add_argument("--tensor-parallel", type=int, default=1, help="GPUs one vLLM server spans")
    ap.add_argument("--trust-remote-code", default="auto", choices=vllm_server.TRUST_CHOICES,
                    help="run the verifier's own code (auto: when its config has auto_map)")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="one more vLLM server argument, last (repeatable; --vllm-arg=--flag)")
    ap.add_argument("--server-timeout", type=float, default=900)
    ap.add_argument("--overwrite", action="store_true",
                    help="replace a dataset prepared from another file, or hidden states of other layer ids")
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--prepare-later", action="store_true",
                    help="with --plan: the --prepare file is not there yet (a dry run's upload)")
    ap.add_argument("--result", default=None)
    a = ap.parse_args()
    try:
        info = plan(a)
    except Refused as e:
        print(f"[specops] refused: {e}", flush=True)
        emit({"ok": False, "error": str(e), "refused": True})
        return 2
    if a.plan:
        emit({"ok": True, **info})
        return 0
    for what, path in (("dataset", a.data_dir), ("verifier", a.verifier), ("data file", a.prepare)):
        contract.watch(what, path)  # (one removed meanwhile: the error names it)
    return vllm_server.server_job("datagen", a.kind, a.result, lambda: {**info, **execute(a, info)})


if __name__ == "__main__":
    contract.main(main)
