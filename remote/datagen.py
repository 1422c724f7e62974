"""The data stage on this host: prepare-data, then hidden-state extraction (vLLM or HF).

Launch (what `inv prepare-data` / `inv extract` send, from the host workdir; `--plan` first,
synchronously, then the same arguments without it as a detached job):
    <venv>/bin/python3 remote/datagen.py --data-dir data/default --verifier /models/V --kind cuda \
        [--prepare convs.jsonl --seq-length 2048] \
        [--extract --backend vllm|hf --layers 2,30,58,61 --shard 0/4 | --rows 0:2000] \
        [--plan [--prepare-later]] [--result runs/R/result.json]

--plan validates everything (verifier config, layer ids, shard, inputs, the disk budget) and
changes nothing. Without it: prepare runs `speculators prepare-data` (a vLLM render server is
started when rows are conversations); extract runs a vLLM server with the
`extract_hidden_states` speculative config and a hidden-states connector (cpu hosts: the
CPU-safe one in remote/cpu_hs_connector.py) plus `speculators generate-offline-data
--validate-outputs`, or a transformers forward (`--backend hf`) writing identical files.
Existing readable files are skipped. The server is stopped by its process group whatever
happens (SIGTERM and Ctrl-C included).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import hostenv
from contract import emit
from datafmt import RECORD, HeaderError, hs_files, read_arrow_columns, safetensors_header, verifier_config

HEADROOM = 1.10


class Refused(Exception):
    """A precondition failed: one line, nothing started."""


def parse_layers(spec, n):
    if spec:
        try:
            ids = [int(x) for x in str(spec).replace(" ", "").split(",") if x != ""]
        except ValueError:
            raise Refused(f"--layers {spec!r}: give comma-separated integers, e.g. 2,{n // 2},{n - 3},{n}") from None
    else:
        ids = [2, n // 2, n - 3, n]
        if not all(a < b for a, b in zip(ids, ids[1:])) or ids[0] < 0:
            raise Refused(f"the verifier has {n} layers: speculators' default layer ids {ids} are not valid "
                          f"there; pass --layers explicitly (distinct, ascending, last = {n}), "
                          f"e.g. {max(n // 4, 1)},{n // 2},{n - 1},{n}")
    if len(set(ids)) != len(ids) or ids != sorted(ids):
        raise Refused(f"--layers {ids}: ids must be distinct and ascending")
    if min(ids) < 0 or max(ids) > n:
        raise Refused(f"--layers {ids}: the verifier has {n} layers, so ids must lie in [0, {n}]")
    if ids[-1] != n:
        raise Refused(f"--layers {ids}: the last id must be {n} (the residual stream before the final norm, "
                      f"which EAGLE-3 trains against)")
    if len(ids) < 2:
        raise Refused(f"--layers {ids}: give at least one auxiliary layer id before {n}")
    return ids


def parse_range(shard, rows, n_rows):
    """-> (start, end) rows, speculators' contiguous split for --shard i/n."""
    if shard and rows:
        raise Refused("give --shard or --rows, not both")
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
            assert 0 <= i < n
        except (ValueError, AssertionError):
            raise Refused(f"--shard {shard!r}: use i/n with 0 <= i < n, e.g. 0/4") from None
        chunk, rem = divmod(n_rows, n)
        start = i * chunk + min(i, rem)
        return start, start + chunk + (1 if i < rem else 0)
    if rows:
        try:
            a, b = rows.split(":")
            a, b = int(a or 0), int(b) if b else n_rows
            assert 0 <= a <= b
        except (ValueError, AssertionError):
            raise Refused(f"--rows {rows!r}: use a:b with 0 <= a <= b, e.g. 0:2000") from None
        return a, min(b, n_rows)
    return 0, n_rows


def readable(p):
    try:
        _, _, expect = safetensors_header(p)
        return p.stat().st_size >= expect
    except (HeaderError, OSError):
        return False


def rows_need_render(src):
    """True if the data are conversations (need the render endpoint), False if pre-tokenised."""
    p = Path(src)
    files = sorted(p.glob("*.json*")) if p.is_dir() else [p]
    for f in files:
        with open(f) as fh:
            first = fh.readline().strip()
        if first.startswith("["):
            first_row = json.loads(Path(f).read_text())[0]
        else:
            first_row = json.loads(first) if first else {}
        return not ("input_ids" in first_row and "loss_mask" in first_row)
    raise Refused(f"{src}: no .json/.jsonl data found")


def free_bytes(path):
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def plan(a):
    """Everything checkable before anything starts. Raises Refused."""
    if not a.verifier:
        raise Refused("no verifier: set `verifier:` for the host in hosts.yaml or pass --verifier PATH")
    vc = verifier_config(a.verifier)
    if vc is None:
        raise Refused(f"verifier {a.verifier}: no config.json there (a HF model directory is needed)")
    hidden, n = vc
    out = {"verifier": a.verifier, "hidden_size": hidden, "num_hidden_layers": n, "data_dir": a.data_dir}
    data = Path(a.data_dir)
    if a.prepare and a.prepare_later and not Path(a.prepare).exists():
        out["prepare_later"] = True  # (a dry run: the laptop's file is uploaded before the real run)
    elif a.prepare:
        if not Path(a.prepare).exists():
            raise Refused(f"--prepare {a.prepare}: no such file on this host")
        out["needs_render_server"] = rows_need_render(a.prepare)
        out["already_prepared"] = bool(list(data.glob("*.arrow")))
    if a.extract:
        out["layer_ids"] = parse_layers(a.layers, n)
        if a.backend == "vllm" and a.rows:
            raise Refused("--rows is for --backend hf; the vllm backend splits with --shard i/n")
        if (data / "state.json").is_file():
            seq = read_arrow_columns(data, ["seq_len"])["seq_len"]
            start, end = parse_range(a.shard, a.rows, len(seq))
            have = hs_files(data)
            todo = [i for i in range(start, end) if not (i in have and readable(have[i]))]
            tokens = sum(seq[i] for i in todo)
            need = tokens * len(out["layer_ids"]) * hidden * 2
            free = free_bytes(data)
            out.update(rows=[start, end], todo=len(todo), done=(end - start) - len(todo), tokens=tokens,
                       estimate_bytes=need, free_bytes=free)
            print(f"[specops] disk budget: {tokens} tokens x {len(out['layer_ids'])} layers x {hidden} hidden x "
                  f"2 B = {gib(need)} needed (+10%), {gib(free)} free at {data}", flush=True)
            if need * HEADROOM > free:
                raise Refused(f"extraction needs {gib(need)} (+10% headroom = {gib(need * HEADROOM)}) but only "
                              f"{gib(free)} is free at {data.resolve()}: free space, shard the rows, or move the data dir")
        elif not a.prepare:
            raise Refused(f"{data}: no prepared dataset (state.json): run `inv prepare-data` first")
    return out


def hf_extract(data, verifier, layer_ids, start, end, kind):
    """Transformers forward; last slot = residual before the final norm (a pre-hook on the norm:
    HF's hidden_states[-1] already has the norm applied)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    device = "cuda" if kind == "cuda" and torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(verifier, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.to(device).eval()
    n = model.config.num_hidden_layers
    captured = {}
    model.model.norm.register_forward_pre_hook(lambda _m, inp: captured.__setitem__("pre_norm", inp[0]))
    ids_col = read_arrow_columns(data, ["input_ids"])["input_ids"]
    out = Path(data) / "hidden_states"
    out.mkdir(parents=True, exist_ok=True)
    have = hs_files(data)
    t0, tokens, done = time.time(), 0, 0
    with torch.inference_mode():
        for i in range(start, end):
            if i in have and readable(have[i]):
                continue
            ids = torch.tensor(ids_col[i], dtype=torch.long, device=device)
            res = model.model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
            hs = res.hidden_states
            slots = [captured["pre_norm"][0] if k == n else hs[k][0] for k in layer_ids]
            hidden = torch.stack(slots, dim=1).to(torch.bfloat16).cpu().contiguous()
            tmp = out / f".hs_{i}.safetensors.tmp"
            save_file({"hidden_states": hidden, "token_ids": ids.cpu().contiguous()}, str(tmp))
            os.replace(tmp, out / f"hs_{i}.safetensors")  # never a truncated file under the real name
            tokens += ids.numel()
            done += 1
            if done % 50 == 0 or i == end - 1:
                dt = time.time() - t0
                print(f"[specops] hf extract: {done} files, {tokens} tokens, {tokens / max(dt, 1e-9):.0f} tokens/s",
                      flush=True)
    dt = time.time() - t0
    return {"files": done, "tokens": tokens, "seconds": round(dt, 2),
            "tokens_per_s": round(tokens / dt, 1) if dt > 0 else None, "device": device}


def run_cmd(argv, env=None):
    print(f"[specops] $ {' '.join(argv)}", flush=True)
    t0 = time.time()
    rc = subprocess.call(argv, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv[2:4])} exited {rc}")
    return time.time() - t0


def execute(a, info):
    import vllm_server

    data = Path(a.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    run_dir = Path(a.result).parent if a.result else data
    res = {"steps": []}
    need_server = (a.prepare and info.get("needs_render_server") and not info.get("already_prepared")) or \
                  (a.extract and a.backend == "vllm")
    server = None
    try:
        if need_server:
            port = vllm_server.free_port()
            env = vllm_server.server_env(os.getcwd(), a.kind)
            stage = data / ".hs_stage"
            stage.mkdir(exist_ok=True)
            argv = vllm_server.server_argv(
                a.verifier, port, kind=a.kind, layer_ids=info.get("layer_ids") if a.extract and a.backend == "vllm"
                else None, stage=stage, max_model_len=a.max_model_len)
            server = vllm_server.start(run_dir, argv, env, port, a.server_timeout)
            url = f"http://127.0.0.1:{port}"
        if a.prepare:
            if info.get("already_prepared"):
                print(f"[specops] {data} already holds a prepared dataset: prepare-data skipped", flush=True)
            else:
                argv = [sys.executable, "-m", "speculators", "prepare-data", "--model", a.verifier,
                        "--data", a.prepare, "--output", str(data), "--seq-length", str(a.seq_length),
                        "--no-skip-token-freq"]
                if info.get("needs_render_server"):
                    argv += ["--render-endpoint", url]
                res["prepare_seconds"] = round(run_cmd(argv), 1)
            res["steps"].append("prepare")
        if a.extract:
            info.update(plan(a))  # now that the dataset exists: rows, budget (refuses if too big)
            start, end = info["rows"]
            if a.backend == "vllm":
                argv = [sys.executable, "-m", "speculators", "generate-offline-data", "--endpoint", f"{url}/v1",
                        "--model", a.verifier, "--preprocessed-data", str(data), "--concurrency",
                        str(a.concurrency), "--validate-outputs", "--fail-on-error"]
                if a.shard:
                    i, n = a.shard.split("/")
                    argv += ["--world-size", n, "--rank", i]
                secs = run_cmd(argv)
                res["extract"] = {"tokens": info["tokens"], "seconds": round(secs, 2),
                                  "tokens_per_s": round(info["tokens"] / secs, 1) if secs > 0 else None}
            else:
                res["extract"] = hf_extract(data, a.verifier, info["layer_ids"], start, end, a.kind)
            res["steps"].append("extract")
            rec_path = data / RECORD
            rec = json.loads(rec_path.read_text()) if rec_path.is_file() else {}
            rec.update(verifier=os.path.abspath(a.verifier), layer_ids=info["layer_ids"],
                       stored_layers=len(info["layer_ids"]), hidden_size=info["hidden_size"],
                       backend=a.backend, updated=time.time())
            rec_path.write_text(json.dumps(rec, indent=1))
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
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--server-timeout", type=float, default=900)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--prepare-later", action="store_true",
                    help="with --plan: the --prepare file is not there yet (a dry run's upload)")
    ap.add_argument("--result", default=None)
    a = ap.parse_args()
    try:
        info = plan(a)
    except Refused as e:
        print(f"[specops] refused: {e}", flush=True)
        emit({"ok": False, "error": str(e)})
        return 2
    if a.plan:
        emit({"ok": True, **info})
        return 0

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    hostenv.apply(os.getcwd(), a.kind)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    t0 = time.time()
    try:
        res = {"ok": True, **info, **execute(a, info)}
        code = 0
    except Refused as e:
        res, code = {"ok": False, "error": str(e)}, 2
    except Exception as e:  # noqa: BLE001
        res, code = {"ok": False, "error": f"{type(e).__name__}: {e}"}, 1
    res["seconds"] = round(time.time() - t0, 1)
    if a.result:
        Path(a.result).write_text(json.dumps(res, indent=1, default=str))
    print(f"[specops] datagen {'done' if res['ok'] else 'FAILED: ' + res['error']}", flush=True)
    if not a.result:
        emit(res)
    return code


if __name__ == "__main__":
    import contract

    contract.main(main)
