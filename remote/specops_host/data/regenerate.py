"""Regenerate a dataset's responses with the verifier itself: `speculators regenerate-responses`
against a managed vLLM server of the verifier (the same launch code as extraction).

Launch (what `inv regenerate` sends, from the host workdir; `--plan` first, synchronously, then
the same arguments without it as a detached job):
    <venv>/bin/python3 -m specops_host.data.regenerate --data convs.jsonl --out regenerated/NAME.jsonl \
        --verifier /models/V --kind cuda [--seq-length 2048] [--max-tokens N] [--concurrency 32] [--limit N] \
        [--sampling-params JSON] [--max-model-len N] [--tensor-parallel 8] \
        [--trust-remote-code auto|true|false] [--vllm-arg=ARG ...] [--plan [--data-later]] [--result R]

Input: .json/.jsonl rows with `messages` / `conversations` (role/content or from/value) or a
`prompt`; their system and user turns are sent to the verifier and its own responses replace
the original assistant turns. Output: one JSONL row per verifier response (a single-turn
prompt gives one row): input_ids (the chat-rendered prompt + the response's tokens), loss_mask
(0 over the prompt, 1 over the response), the response's text; rows of that kind go through
`inv prepare-data` as pre-tokenised data.
Sampling, the answers' cap and what the answers came out as (cut at the cap, looping): see
answers.py; the plan says the sampling in one line, the run a progress line every 15 s.
The output appears whole or not at all: speculators writes into the run dir, and the file is
moved to --out only when the run succeeds (the rows that failed: NAME.errors.jsonl beside it).
A server that dies (or stops answering /health) fails the run with its log's tail; the server
is stopped by its process group whatever happens.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from specops_host import contract
from specops_host.serve import vllm_server
from specops_host.contract import Refused, emit
from specops_host.data import answers
from specops_host.datafmt import utf8_text, verifier_config, verifier_positions
from specops_host.jobs.procs import wait_trainer

PORT = "<port>"


def prompt_rows(path):
    """(rows, rows with a usable system/user turn) of a .json/.jsonl file, as speculators reads it."""
    p = Path(path)
    if p.suffix.lower() not in (".json", ".jsonl"):
        raise Refused(f"--data {path}: give a .json or .jsonl file of conversations (messages/conversations) or "
                      f"prompts")
    if not p.is_file():
        raise Refused(f"--data {path}: no such file on this host")
    text = utf8_text(p, "--data")  # (a byte that is not UTF-8: its line and offset, before any server)
    try:
        if text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as e:
        raise Refused(f"--data {path}: not JSON/JSONL ({str(e).splitlines()[0]})") from None
    usable = 0
    for r in rows:
        if not isinstance(r, dict):
            continue
        turns = next((r[k] for k in ("messages", "conversations", "prompt") if isinstance(r.get(k), list) and r[k]),
                     [])
        users = [m for m in turns if isinstance(m, dict) and (m.get("role") or m.get("from")) in ("user", "human")
                 and (m.get("content") or m.get("value"))]
        if users or (isinstance(r.get("prompt"), str) and r["prompt"]):
            usable += 1
    return len(rows), usable


def plan(a):
    if not a.verifier:
        raise Refused("no verifier: set `verifier:` for the host in hosts.yaml or pass --verifier PATH")
    if verifier_config(a.verifier) is None:
        raise Refused(f"verifier {a.verifier}: no config.json there (a HF model directory is needed)")
    if a.tensor_parallel < 1:
        raise Refused(f"--tensor-parallel {a.tensor_parallel}: give 1 or more (GPUs one vLLM server spans)")
    for flag, v in (("--max-tokens", a.max_tokens), ("--seq-length", a.seq_length), ("--concurrency", a.concurrency)):
        if v is not None and v < 1:
            raise Refused(f"{flag} {v}: give 1 or more")
    if a.limit is not None and a.limit < 1:
        raise Refused(f"--limit {a.limit}: give 1 or more")
    if a.sampling_params:
        try:
            sp = json.loads(a.sampling_params)
        except ValueError:
            sp = None
        if not isinstance(sp, dict):
            raise Refused(f"--sampling-params {a.sampling_params!r}: give a JSON object, e.g. "
                          f"'{{\"temperature\": 0.6, \"top_p\": 0.95}}'")
    a.max_tokens, cap_from = answers.choose_cap(a.max_tokens, a.seq_length,
                                                a.max_model_len or verifier_positions(a.verifier)[0])
    if a.max_model_len is not None and a.max_model_len <= a.max_tokens:
        raise Refused(f"--max-model-len {a.max_model_len}: a prompt and its response ({a.max_tokens} tokens at "
                      f"most, --max-tokens) must fit: give more than {a.max_tokens}")
    params, source = answers.choose_sampling(a.verifier, a.sampling_params)
    a.sampling_params = json.dumps(params)
    vllm_server.check_user_args(a.vllm_arg)
    out = Path(a.out)
    if out.suffix != ".jsonl":
        raise Refused(f"--out {a.out}: the output is a .jsonl file")
    if out.exists():
        raise Refused(f"{out} exists: pick another --out name (or remove it first)")
    info = {"verifier": os.path.abspath(a.verifier), "out": str(out.resolve()),
            "errors_file": str(out.resolve().with_name(out.stem + ".errors.jsonl")),
            "trust_remote_code": vllm_server.decide_trust(a.verifier, a.trust_remote_code),
            "tensor_parallel": a.tensor_parallel, "vllm_args": list(a.vllm_arg), "max_tokens": a.max_tokens,
            "max_tokens_from": cap_from, "sampling": params, "sampling_from": source,
            "sampling_line": answers.sampling_line(params, source) + f"; answers capped at {a.max_tokens} tokens "
                                                                      f"({cap_from})"}
    if a.data_later and not Path(a.data).exists():
        info["data_later"] = True  # (a dry run: the laptop's file is uploaded before the real run)
    else:
        rows, usable = prompt_rows(a.data)
        if not usable:
            raise Refused(f"--data {a.data}: none of its {rows} rows has a user turn (messages/conversations with "
                          f"role user, or a prompt)")
        info.update(rows=rows, prompts=min(usable, a.limit) if a.limit else usable)
    info["commands"] = [server_cmd(a, info, PORT), regen_cmd(a, info, PORT, "<run dir>/regenerated.jsonl")]
    return info


def server_cmd(a, info, port):
    return vllm_server.server_argv(info["verifier"], port, kind=a.kind, max_model_len=a.max_model_len,
                                   tensor_parallel=a.tensor_parallel, trust_remote_code=info["trust_remote_code"],
                                   user_args=a.vllm_arg)


def regen_cmd(a, info, port, outfile):
    """speculators regenerate-responses, through this file's `--speculators` entry (it gives the
    tokenizer the run's trust_remote_code, which the command does not take)."""
    argv = [sys.executable, "-m", "specops_host.data.regenerate", "--speculators"]
    if info["trust_remote_code"]:
        argv.append("--trust-remote-code")
    argv += ["--endpoint", f"http://127.0.0.1:{port}/v1/chat/completions", "--model", info["verifier"],
             "--dataset", os.path.abspath(a.data), "--outfile", str(outfile), "--concurrency", str(a.concurrency),
             "--max-tokens", str(a.max_tokens), "--max-retries", str(a.max_retries)]
    if a.limit:
        argv += ["--limit", str(a.limit)]
    if a.sampling_params:
        argv += ["--sampling-params", a.sampling_params]
    return argv


def first_error(path):
    try:
        with open(path) as f:
            for line in f:
                return str((json.loads(line).get("metadata") or {}).get("error"))[:300]
    except (OSError, ValueError):
        return None
    return None


def publish(src, dst):
    """src -> dst whole (a temp file beside dst, then a rename)."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def execute(a, info, run_dir):
    part = run_dir / "regenerated.jsonl"
    errs = run_dir / "regenerated.errors.jsonl"
    for p in (part, errs):
        p.unlink(missing_ok=True)
    port = vllm_server.free_port()
    env = vllm_server.server_env(os.getcwd(), a.kind, a.tensor_parallel)
    base = dict(os.environ)
    server = None
    proc = None
    try:
        server = vllm_server.start(run_dir, server_cmd(a, info, port), env, port, a.server_timeout)
        argv = regen_cmd(a, info, port, part)
        print(f"[specops] {info['sampling_line']}", flush=True)
        print(f"[specops] $ {' '.join(argv)}", flush=True)
        t0 = time.time()
        ans = answers.Answers(part, errs)
        ended = threading.Event()
        tick = threading.Thread(target=answers.ticker, daemon=True,
                                args=(ans, info.get("prompts"), t0, a.progress_every,
                                      lambda line: print(f"[specops] {line}", flush=True), ended.is_set))
        proc = subprocess.Popen(argv, env={**base, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL)
        tick.start()
        try:
            died = vllm_server.watch(proc, server, f"http://127.0.0.1:{port}", a.hang_seconds, "regeneration")
        finally:
            ended.set()
            tick.join()
        if died is not None:
            proc.terminate()
            wait_trainer(proc, 30)
            raise vllm_server.ServerDied(vllm_server.died_line(died, server))
        seconds = time.time() - t0
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            wait_trainer(proc, 30)
        vllm_server.stop(run_dir / "server")
    rc = proc.returncode
    ans.read()
    rows, errors = ans.rows, ans.errors()
    print(f"[specops] {answers.progress_line(ans.done(), info.get('prompts'), seconds)}", flush=True)
    res = {"rows": rows, "errors": errors, "regenerate_seconds": round(seconds, 1), "exit": rc,
           "cut": ans.cut, "looping": ans.looping, "quality": answers.quality_line(ans, a.max_tokens)}
    if rc != 0:
        raise RuntimeError(f"speculators regenerate-responses exited {rc}")
    if rows == 0:
        why = first_error(errs)
        raise Refused(f"the verifier gave no response for any of the {info.get('prompts', '?')} prompt(s)"
                      + (f" (first error: {why})" if why else "") + f": see {errs}")
    publish(part, info["out"])
    if res["quality"]:
        print(f"[specops] {res['quality']}", flush=True)
    if errors:
        publish(errs, info["errors_file"])
        print(f"[specops] {errors} conversation(s) failed (first: {first_error(errs)}): {info['errors_file']}",
              flush=True)
    part.unlink(missing_ok=True)
    print(f"[specops] {rows} row(s) of verifier responses -> {info['out']}", flush=True)
    return res


def speculators_main(argv):
    """`speculators regenerate-responses ARGS`, its tokenizer given trust_remote_code when asked."""
    trust = "--trust-remote-code" in argv
    argv = [x for x in argv if x != "--trust-remote-code"]
    if trust:
        from transformers import AutoTokenizer

        orig = AutoTokenizer.from_pretrained
        AutoTokenizer.from_pretrained = staticmethod(lambda *p, **k: orig(*p, **{"trust_remote_code": True, **k}))
    from speculators.cli import app

    sys.argv = ["speculators", "regenerate-responses", *argv]
    app()


def main():
    if sys.argv[1:2] == ["--speculators"]:
        return speculators_main(sys.argv[2:])
    ap = argparse.ArgumentParser(prog="regenerate.py")
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--verifier", default=None)
    ap.add_argument("--kind", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--sampling-params", default=None)
    ap.add_argument("--max-retries", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--tensor-parallel", type=int, default=1)
    ap.add_argument("--trust-remote-code", default="auto", choices=vllm_server.TRUST_CHOICES)
    ap.add_argument("--vllm-arg", action="append", default=[])
    ap.add_argument("--server-timeout", type=float, default=900)
    ap.add_argument("--hang-seconds", type=float, default=600)
    contract.progress_option(ap)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--data-later", action="store_true")
    ap.add_argument("--result", default=None)
    a = ap.parse_args()
    contract.use_progress_every(a.progress_every)
    info = plan(a)
    if a.plan:
        emit({"ok": True, **info})
        return 0

    run_dir = Path(a.result).parent if a.result else Path(a.out).parent
    return vllm_server.server_job("regenerate", a.kind, a.result, lambda: {**info, **execute(a, info, run_dir)})


if __name__ == "__main__":
    contract.main(main)
